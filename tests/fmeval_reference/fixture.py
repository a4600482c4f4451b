"""The fmeval 1.2.3 reference: fmeval's own functions, run in an environment of their own
(``.venv-fmeval``, which `make test` builds: fmeval's dependencies, ray and pyarrow among them,
do not fit evalq's), through ``tests/fmeval_reference/compute.py``."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FMEVAL_PYTHON = Path(os.environ.get("EVALQ_FMEVAL_PYTHON", ROOT / ".venv-fmeval" / "bin" / "python"))
SCRIPT = ROOT / "tests" / "fmeval_reference" / "compute.py"


@pytest.fixture(scope="session")
def fmeval():
    """``fmeval(op, cases) -> results``: each case computed by fmeval 1.2.3 itself (one reference
    process for the session)."""
    if not FMEVAL_PYTHON.exists():
        pytest.fail(f"the fmeval reference environment is missing ({FMEVAL_PYTHON}): `make test` builds it "
                    "(make fmeval-reference)")
    proc = subprocess.Popen([str(FMEVAL_PYTHON), str(SCRIPT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "HF_HUB_OFFLINE": "1", "RAY_DISABLE_USAGE_STATS": "1"})
    assert proc.stdout.readline().strip() == "ready", "the fmeval reference process did not start"

    def run(op: str, cases: list) -> list:
        proc.stdin.write(json.dumps({"op": op, "cases": cases}) + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"the fmeval reference process ended ({proc.wait()}); its stderr is above")
        return json.loads(line)

    yield run
    proc.stdin.close()
    proc.wait(timeout=30)
