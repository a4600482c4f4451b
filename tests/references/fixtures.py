"""Peer libraries the tests compare evalq's values with, each run by its own code in an environment
of its own (their dependencies do not fit evalq's; `make test` builds them): fmeval 1.2.3 in
``.venv-fmeval``, ragas in ``.venv-ragas``. A script per library (``*_compute.py`` here) serves its
functions: one request a line on stdin, one JSON answer a line on stdout, one process a session.
Azure AI Evaluation 1.18.10 (``.venv-azure``) serves its parser of agent messages."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def serve(name: str, python: Path, script: Path, env: dict | None = None):
    """Start a reference process; returns (``run(op, cases) -> results``, the process)."""
    if not python.exists():
        pytest.fail(f"the {name} reference environment is missing ({python}): `make test` builds it "
                    f"(make references)")
    proc = subprocess.Popen([str(python), str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})
    assert proc.stdout.readline().strip() == "ready", f"the {name} reference process did not start"

    def run(op: str, cases: list) -> list:
        proc.stdin.write(json.dumps({"op": op, "cases": cases}) + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"the {name} reference process ended ({proc.wait()}); its stderr is above")
        return json.loads(line)

    return run, proc


def _stop(proc) -> None:
    proc.stdin.close()
    proc.wait(timeout=30)


@pytest.fixture(scope="session")
def fmeval():
    """``fmeval(op, cases) -> results``: each case computed by fmeval 1.2.3 itself."""
    python = Path(os.environ.get("EVALQ_FMEVAL_PYTHON", ROOT / ".venv-fmeval" / "bin" / "python"))
    run, proc = serve("fmeval", python, HERE / "fmeval_compute.py", {"RAY_DISABLE_USAGE_STATS": "1"})
    yield run
    _stop(proc)


@pytest.fixture(scope="session")
def ragas():
    """``ragas(op, cases) -> results``: each case computed by ragas itself."""
    python = Path(os.environ.get("EVALQ_RAGAS_PYTHON", ROOT / ".venv-ragas" / "bin" / "python"))
    run, proc = serve("ragas", python, HERE / "ragas_compute.py")
    yield run
    _stop(proc)


@pytest.fixture(scope="session")
def azure():
    """``azure(op, cases) -> results``: each case read by azure-ai-evaluation's own parser."""
    python = Path(os.environ.get("EVALQ_AZURE_PYTHON", ROOT / ".venv-azure" / "bin" / "python"))
    run, proc = serve("azure-ai-evaluation", python, HERE / "azure_compute.py")
    yield run
    _stop(proc)
