"""evalq installs under one import name, and each package imports only what its
layer allows: the wheel is built here (``pip wheel --no-deps``) and read."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

# repository folder -> the package it installs as
PACKAGE_DIRS = {"orchestrator": "evalq/orchestrator", "workers": "evalq/workers", "shared": "evalq/shared",
                "evalq": "evalq"}
OLD_NAMES = {"orchestrator", "workers", "shared"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    build = tmp_path_factory.mktemp("build")
    # --no-build-isolation: setuptools from this environment, no index needed
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "--quiet", "-w", str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=240,
                          env={**os.environ, "TMPDIR": str(build)})
    assert proc.returncode == 0, proc.stderr
    (found,) = out.glob("evalq-*.whl")
    return found


def _names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        return z.namelist()


def test_wheel_has_one_top_level_package(wheel):
    top = {n.split("/", 1)[0] for n in _names(wheel) if not n.split("/", 1)[0].endswith(".dist-info")}
    assert top == {"evalq"}


def test_wheel_holds_every_module_of_the_code_folders(wheel):
    names = set(_names(wheel))
    expected = set()
    for folder, package in PACKAGE_DIRS.items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder)
            expected.add(f"{package}/{rel.as_posix()}")
    missing = sorted(expected - names)
    assert not missing, f"not in the wheel (add the package to pyproject.toml): {missing}"
    assert "evalq/sim/server.py" in names and "evalq/shared/metrics/bertscore.py" in names


def test_wheel_entry_point_and_imports(wheel, tmp_path):
    with zipfile.ZipFile(wheel) as z:
        entry = next(n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))
        assert "evalq = evalq.cli:main" in z.read(entry).decode()
        z.extractall(tmp_path / "site")
    # the unpacked wheel first on the path, run from a folder without the repository's
    # top-level folders: the packages import from the wheel's layout
    code = ("import evalq.cli, evalq.orchestrator.app, evalq.shared.job.schema, evalq.sim, evalq.workers.tasks; "
            "import importlib.util as u; "
            "print(evalq.cli.__file__); "
            "print([n for n in ('orchestrator', 'workers', 'shared') if u.find_spec(n) is not None])")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**{k: v for k, v in os.environ.items() if k != "EVALQ_PLUGINS"},
                               "PYTHONPATH": str(tmp_path / "site")})
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.splitlines()
    assert first.startswith(str(tmp_path / "site" / "evalq" / "cli"))
    assert second == "[]"


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def _code_files():
    for folder in ("orchestrator", "workers", "shared", "evalq", "tests", "bench", "examples"):
        yield from (ROOT / folder).rglob("*.py")


def test_nothing_imports_the_old_top_level_names():
    bad = [f"{p.relative_to(ROOT)}:{line}: {name}" for p in _code_files() for line, name in _imports(p)
           if name.split(".")[0] in OLD_NAMES]
    assert not bad


def test_shared_imports_nothing_from_workers_or_orchestrator():
    bad = [f"{p.relative_to(ROOT)}:{line}: {name}" for p in (ROOT / "shared").rglob("*.py")
           for line, name in _imports(p)
           if name.startswith(("evalq.workers", "evalq.orchestrator", "evalq.sim"))]
    assert not bad
