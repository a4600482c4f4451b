"""The threads that score a chunk's items side by side in a judge (or generate) worker: one pool per
process (``ITEM_THREADS``), whose threads outlive the chunks, so that no thread is started per chunk
and a worker's calls in flight stay bounded whatever its chunks ask: its 16 chunk threads run chunks
of a few items in order themselves, and the runners of larger chunks share these. Each command a
thread sends borrows a connection from the process's Redis pool (redis-py's holds 100): the chunk
threads and item threads together stay below it."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable


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

    wait([pool.submit(runner) for _ in range(width)])
