"""A gpu worker reads its next chunk while its device scores this one.

A chunk on the gpu queue spends its first moments reading its instances from Redis and decoding
them, while the device waits. So, once a chunk has its own instances, the worker reads those of the
chunk after it (the same entry, the next positions) in a thread, and keeps them in one slot: when
that chunk comes to this worker, as it mostly does (a gpu worker runs one chunk at a time, and the
dispatcher sends an entry's chunks in order), its instances are there already. It is a cache and
nothing more: what it holds was read from the job's stored instances, which never change; a chunk
that comes to another worker, or after the slot was filled for another, reads them itself; a worker
killed with a full slot loses nothing (the chunk's message is redelivered and read again).

A gpu worker of several processes (``--gpu-processes``) reads nothing ahead: the next chunk mostly
goes to another of its processes, and while one process reads, another keeps the device busy.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from evalq.shared.core.config import GPU_PROCESSES_ENV, env_number

log = logging.getLogger("evalq.worker")

_lock = threading.Lock()
_current: list[dict] = []  # the one slot: {"key": (job, entry, start, stop), "done": Event, "instances"}


def take(job_id: str, key: str, start: int, stop: int, wait: float = 30.0) -> list[dict] | None:
    """The instances read ahead for this chunk, or None when the slot holds another's (or none)."""
    with _lock:
        if not _current or _current[0]["key"] != (job_id, key, start, stop):
            return None
        slot = _current.pop()
    if not slot["done"].wait(wait):  # the read is still going after all that while: read it again
        return None
    if slot["instances"] is not None:
        log.info("%s[%d:%d]: instances read ahead while the chunk before scored", key, start, stop)
    return slot["instances"]


def processes() -> int:
    """The processes of this gpu worker (``EVALQ_GPU_PROCESSES``, set by ``evalq worker``)."""
    return int(env_number(GPU_PROCESSES_ENV, 1))


def alone() -> bool:
    """Whether this process is its gpu worker's only one."""
    return processes() <= 1


def ahead(job_id: str, key: str, start: int, stop: int, read: Callable[[list[int]], list[dict]]) -> None:
    """Read positions ``start``..``stop`` of the entry in a thread, into the slot (in a worker's
    only process)."""
    if start >= stop or not alone():
        return
    slot = {"key": (job_id, key, start, stop), "done": threading.Event(), "instances": None}
    with _lock:
        _current[:] = [slot]

    def run() -> None:
        try:
            slot["instances"] = read(list(range(start, stop)))
        except Exception as exc:  # noqa: BLE001 - a cache: the chunk reads its own when this failed
            log.info("read-ahead of %s[%d:%d] failed: %s", key, start, stop, exc)
        finally:
            slot["done"].set()

    threading.Thread(target=run, name="evalq-read-ahead", daemon=True).start()
