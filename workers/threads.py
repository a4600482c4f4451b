"""The threads that score a chunk's items side by side in a judge (or generate) worker: one pool per
process (``ITEM_THREADS``), whose threads outlive the chunks, so that no thread is started per chunk
and a worker's calls in flight stay bounded whatever its chunks ask: its 16 chunk threads run chunks
of a few items in order themselves, and the runners of larger chunks share these. Each command a
thread sends borrows a connection from the process's Redis pool (redis-py's holds 100): the chunk
threads and item threads together stay below it.

A chunk's CPU seconds (``counting``) are its own thread's and those of every thread that worked for
it here or in a panel (``measured``): the report splits a chunk's time into compute and waiting."""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, Callable, Iterator


ITEM_THREADS = 64  # a worker's threads that score items side by side, at most (its chunks' runners queue)

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def side_by_side(run: Callable[[int], None], indices: list[int], width: int) -> None:
    """``run(i)`` for every index, by ``width`` runners on the process's item threads, each taking the
    next index until none is left (``run`` says when to stop: it takes no more once told)."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(ITEM_THREADS, thread_name_prefix="evalq-item")
        pool = _pool
    todo, take = iter(indices), threading.Lock()

    def runner() -> None:
        while True:
            with take:
                i = next(todo, None)
            if i is None:
                return
            run(i)

    wait([pool.submit(contextvars.copy_context().run, measured, runner) for _ in range(width)])


class Cpu:
    """The CPU seconds of a chunk's run: its thread's since it began, and those ``measured`` for it."""

    def __init__(self) -> None:
        self.start, self.others = time.thread_time(), []

    def seconds(self) -> float:
        return time.thread_time() - self.start + sum(self.others)


_CPU: contextvars.ContextVar[Cpu | None] = contextvars.ContextVar("evalq_chunk_cpu", default=None)


@contextlib.contextmanager
def counting() -> Iterator[Cpu]:
    """A ``Cpu`` for the run inside (a chunk's), which threads started with a copy of this context add to."""
    cpu = Cpu()
    token = _CPU.set(cpu)
    try:
        yield cpu
    finally:
        _CPU.reset(token)


def measured(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` on this thread, whose CPU seconds count for the run that started it (``counting``)."""
    cpu, start = _CPU.get(), time.thread_time()
    try:
        return fn(*args)
    finally:
        if cpu is not None:
            cpu.others.append(time.thread_time() - start)  # (a list's append is atomic)
