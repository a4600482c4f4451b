"""The job path's functions timed where they run: with ``EVALQ_TIMING_DIR`` set, each function
named in ``TARGETS`` is wrapped as its module is imported, and this process keeps, per function,
its calls and its seconds (inclusive: a function's time holds the timed functions it calls; work in
a thread other than the main one counted apart, ``[thread]``), written to
``$EVALQ_TIMING_DIR/<pid>.json`` four times a second and at exit. measure.py's profile phase puts
this folder first on the embedded workers' PYTHONPATH, so Python imports it as each worker (and each
forked child) starts, and calls ``install`` and ``wrap_loaded`` for its own process. Timed, not
sampled: a sampling thread sees the others only when it gets the GIL, so its samples gather where
they release it (a device call, a socket read) and misplace the rest. A wrapped call costs about a
microsecond; nothing here runs without the variable."""

from __future__ import annotations

import functools
import importlib.abc
import inspect
import json
import os
import sys
import threading
import time

TARGETS = {
    "evalq.workers.chunk": ["run_chunk", "_run_together", "score_items", "_record_chunk", "_write",
                            "_read_ahead", "_entry_instances", "_chunk_records", "settle"],
    "evalq.workers.prefetch": ["take", "ahead"],
    "evalq.workers.metrics.bertscore.metric": ["bertscore"],
    "evalq.workers.metrics.bertscore.models": ["load_model"],
    "evalq.workers.metrics.bertscore.engine": ["score", "embed", "match", "encode"],
    "evalq.workers.fmeval.toxicity": ["toxicity", "classifier"],
    "evalq.orchestrator.finalize": ["finalize", "summarize", "_write", "reply"],
    "evalq.results.recording": ["record_job"],
    "evalq.results.outputs": ["write_outputs"],
    "evalq.results.report": ["chunk_view"],
    "evalq.orchestrator.dispatch": ["enqueue", "refill", "chunk_done"],
    "evalq.orchestrator.submit": ["submit", "job_spec", "store_job", "start"],
    "evalq.cli.wait": ["wait"],
}

_totals: dict[str, list] = {}  # "module:function" -> [calls, seconds]
_lock = threading.Lock()
_state = {"dir": None, "dirty": False}


def _timed(fn, key: str):
    main = threading.main_thread

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            took = time.perf_counter() - t0
            name = key if threading.current_thread() is main() else key + " [thread]"
            with _lock:
                entry = _totals.setdefault(name, [0, 0.0])
                entry[0] += 1
                entry[1] += took
                _state["dirty"] = True

    timed.__evalq_timed__ = True
    return timed


def _wrap(module) -> None:
    for name in TARGETS.get(module.__name__, ()):
        fn = getattr(module, name, None)
        if inspect.isfunction(fn) and not getattr(fn, "__evalq_timed__", False):  # never a Celery task object
            setattr(module, name, _timed(fn, f"{module.__name__.removeprefix('evalq.')}:{name}"))


class _Loader(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        _wrap(module)  # before any other module takes a name from it


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in TARGETS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


def _dump() -> None:
    directory = _state["dir"]
    with _lock:
        if not _state["dirty"]:
            return
        data = {"pid": os.getpid(), "argv": sys.argv, "t": time.time(),
                "totals": {k: [v[0], round(v[1], 6)] for k, v in _totals.items()}}
        _state["dirty"] = False
    path = os.path.join(directory, f"{os.getpid()}.json")
    with open(path + ".tmp", "w") as fh:
        json.dump(data, fh)
    os.replace(path + ".tmp", path)


def _writer() -> None:
    while True:
        time.sleep(0.25)
        try:
            _dump()
        except Exception:  # noqa: BLE001 - timing never takes its process down
            pass


def _start_writer() -> None:
    threading.Thread(target=_writer, name="evalq-timing", daemon=True).start()


def _after_fork() -> None:  # a prefork child: its own totals, file and writer
    with _lock:
        _totals.clear()
        _state["dirty"] = False
    _start_writer()


def install(directory: str) -> None:
    """Wrap the targets as they are imported, and keep the totals in ``directory``."""
    os.makedirs(directory, exist_ok=True)
    _state["dir"] = directory
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
        os.register_at_fork(after_in_child=_after_fork)
        import atexit

        atexit.register(lambda: _state["dir"] and _dump())
        _start_writer()


def wrap_loaded() -> None:
    """Wrap the targets of modules this process imported already (their callers that look them up
    in the module at each call, as evalq's do, then call the timed ones)."""
    for name in TARGETS:
        module = sys.modules.get(name)
        if module is not None:
            _wrap(module)


def read(directory: str) -> dict[int, dict]:
    """Every process's last written totals: pid -> {"argv", "totals"}."""
    out = {}
    for entry in os.listdir(directory) if os.path.isdir(directory) else []:
        if entry.endswith(".json"):
            try:
                with open(os.path.join(directory, entry)) as fh:
                    data = json.load(fh)
                out[data["pid"]] = data
            except (OSError, ValueError, KeyError):
                pass
    return out


if os.environ.get("EVALQ_TIMING_DIR"):
    install(os.environ["EVALQ_TIMING_DIR"])
