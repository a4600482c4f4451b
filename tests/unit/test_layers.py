"""The layout tells the truth about the flow, and stays that way (read from the source, like
the wheel test): each room imports only the rooms below it, no module imports itself back
through others (imports inside functions count), no module reaches for another's private
names, and no module grows past what a reader takes in at once.

    cli -> orchestrator -> results -> shared        workers -> orchestrator -> results -> shared
    sim -> shared
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# import name -> folder in the repository (pyproject's package-dir)
PACKAGES = {"evalq.orchestrator": ROOT / "orchestrator", "evalq.workers": ROOT / "workers",
            "evalq.shared": ROOT / "shared", "evalq": ROOT / "evalq"}
ROOMS = ("cli", "orchestrator", "workers", "results", "shared", "sim")
# what each room may import (besides itself)
ALLOWED = {
    "shared": set(),
    "results": {"shared"},  # what a job's scores become (issue 59): outputs, report, history, exports
    "orchestrator": {"results", "shared"},
    "workers": {"orchestrator", "results", "shared"},
    "cli": {"orchestrator", "results", "shared", "sim"},
    "sim": {"shared"},
    "root": {"cli", "shared"},  # evalq/__init__.py, evalq/__main__.py
}
MAX_LINES = 450
# shared/ by subject (issue 39): what each of its rooms may import, from the bottom up
SHARED_ALLOWED = {
    "core": set(),
    "policy": {"core"},
    "judging": {"core"},
    "scores": {"core", "judging"},
    "metrics": {"core", "policy", "judging"},
    "cluster": {"core", "scores"},
    "agents": {"core", "judging", "metrics"},
    "traces": {"core", "scores", "agents"},  # a span's chat messages read as an agent record's
    "data": {"core", "policy", "cluster", "agents", "traces"},
    "model": {"core", "judging", "metrics", "cluster", "data"},
    "fmeval": {"core", "policy", "judging", "scores", "metrics", "model"},
    "pairwise": {"core", "judging", "scores", "metrics"},  # two answers compared by a judge (issue 61)
    "job": {"core", "policy", "judging", "scores", "metrics", "cluster", "agents", "data", "model", "fmeval",
            "pairwise", "store"},  # the stored job chooses where its instances and records live (issue 71)
    "store": {"core", "policy", "scores", "data", "cluster"},  # the job store: a job's bulk as parts, outside Redis
}


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if package == "evalq" and parts[0] in ("orchestrator", "workers", "shared"):
                continue
            name = ".".join((package, *parts)).removesuffix(".__init__")
            found[name] = path
    return found


MODULES = modules()


def room(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ROOMS else "root"


def imports(name: str, path: Path) -> tuple[set[str], list[str]]:
    """(evalq modules this module imports, anywhere in it; private names it takes from others)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets, private = set(), []
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            if not base.startswith("evalq"):
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in MODULES:
                    targets.add(full)
                    aliases[alias.asname or alias.name] = full
                else:
                    targets.add(base)
                    if alias.name.startswith("_") and base != name:
                        private.append(f"{name} imports {full}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("evalq"):
                    targets.add(alias.name)
                    aliases[alias.asname or alias.name] = alias.name
    for node in ast.walk(tree):  # module._private through an imported module
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name) and node.value.id in aliases
                and aliases[node.value.id] != name):
            private.append(f"{name} uses {aliases[node.value.id]}.{node.attr}")
    return {t for t in targets if t != name and t in MODULES}, private


GRAPH = {name: imports(name, path) for name, path in MODULES.items()}


def test_every_room_imports_only_the_rooms_below_it():
    wrong = [f"{src} ({room(src)}) imports {dst} ({room(dst)})"
             for src, (targets, _) in sorted(GRAPH.items()) for dst in sorted(targets)
             if room(dst) != room(src) and room(dst) not in ALLOWED[room(src)]]
    assert not wrong, "\n".join(wrong)


def shared_room(name: str) -> str | None:
    parts = name.split(".")
    return parts[2] if len(parts) > 3 and parts[:2] == ["evalq", "shared"] else None


def test_shared_is_a_handful_of_rooms_whose_arrows_run_one_way():
    """Every module of evalq.shared lives in a room named for its subject (its __init__ says what
    it holds and what it may import), and each room imports only the rooms below it."""
    loose = sorted(n for n in MODULES if n.startswith("evalq.shared.") and shared_room(n) is None
                   and n.count(".") == 2 and n.rsplit(".", 1)[1] not in SHARED_ALLOWED)
    assert not loose, f"modules of evalq.shared outside a room: {loose}"
    assert {shared_room(n) for n in MODULES if shared_room(n)} == set(SHARED_ALLOWED)
    wrong = [f"{src} ({shared_room(src)}) imports {dst} ({shared_room(dst) or dst})"
             for src, (targets, _) in sorted(GRAPH.items()) if shared_room(src)
             for dst in sorted(targets) if dst.startswith("evalq.shared")
             and (shared_room(dst) or dst) != shared_room(src) and shared_room(dst) not in SHARED_ALLOWED[shared_room(src)]]
    assert not wrong, "\n".join(wrong)
    for room, allowed in SHARED_ALLOWED.items():
        said = (ROOT / "shared" / room / "__init__.py").read_text()
        assert "May import:" in said, room
        named = said.split("May import:", 1)[1].split(".", 1)[0]
        assert {w.strip() for w in named.split(",") if w.strip() in SHARED_ALLOWED} == allowed, room


def test_no_module_imports_itself_back():
    graph = {src: targets for src, (targets, _) in GRAPH.items()}
    cycles, state = [], defaultdict(int)  # 0 new, 1 on the path, 2 done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state[nxt] == 1:
                cycles.append(" -> ".join(path[path.index(nxt):] + [node, nxt]) if nxt in path
                              else f"{node} -> {nxt}")
            elif state[nxt] == 0:
                visit(nxt, path + [node])
        state[node] = 2

    for module in sorted(graph):
        if state[module] == 0:
            visit(module, [])
    assert not cycles, "\n".join(cycles)


def test_no_private_name_is_taken_from_another_module():
    taken = [p for _, (_, private) in sorted(GRAPH.items()) for p in private]
    assert not taken, "\n".join(taken)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_stay_readable(name):
    lines = len(MODULES[name].read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{MODULES[name].relative_to(ROOT)} has {lines} lines (at most {MAX_LINES})"


def test_the_rooms_hold_what_their_names_say():
    """The client is evalq.cli; the job's life in the cluster (its Celery tasks included) is the
    orchestrator's; workers score chunks."""
    assert (ROOT / "evalq" / "cli" / "__init__.py").is_file()
    tasks = {name: ast.parse(path.read_text()) for name, path in MODULES.items() if name.endswith(".tasks")}
    registered = defaultdict(set)
    for name, tree in tasks.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg == "name" and isinstance(node.value, ast.Constant):
                registered[room(name)].add(node.value.value)
    assert registered["orchestrator"] >= {"evalq.submit_job", "evalq.finalize", "evalq.generated"}
    assert registered["workers"] == {"evalq.score_chunk"}
