"""The CPUs of a gpu worker of several processes, lent to whichever of them is scoring.

``evalq worker --gpu-processes N`` gives each of its N processes a share of the CPUs for torch's
threads (``OMP_NUM_THREADS`` = CPUs / N, ``evalq.cli.workerargs.gpu_environment``), so that N
processes scoring at once do not fight over the cores. But they are not always all scoring: a job
of three chunks on two processes leaves one idle for its third chunk, a job's last chunk runs
alone, and a process waits for its model or its next task. On a CPU device the share of an
idle process then sits unused. Here each process says when it scores (``scoring``), in a table
the pool's parent makes before it forks (``prepare``), and a model metric on a CPU calls
``fit`` before each batch of its forward passes: torch gets the CPUs divided among the processes
scoring at that moment, never fewer than the process's own share. BERTScore's values come out
the same; the toxicity LSTM's within 1e-7 (its sums split another way among threads).

On only where evalq chose the threads: an operator's ``OMP_NUM_THREADS`` is kept as set. The
table holds each process's pid, so a process that died while scoring counts no more.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from typing import Iterator

from evalq.shared.core.config import GPU_CPUS_ENV as CPUS_ENV  # set where evalq chose OMP_NUM_THREADS

log = logging.getLogger("evalq.worker")

_table = None  # multiprocessing Array of pids: > 0 scoring, < 0 idle, 0 free; made in the parent
_threads: list[int] = []  # torch's threads as last set here
_said: set[tuple[int, int]] = set()  # (threads, processes scoring) logged at INFO once each, then at DEBUG


def shared_cpus() -> int:
    """The CPUs this worker's processes share (0: not lent here)."""
    try:
        return int(os.environ.get(CPUS_ENV, "0"))
    except ValueError:
        return 0


def prepare(processes: int) -> None:
    """In the pool's parent, before it forks: the table the processes share."""
    global _table
    if processes > 1 and shared_cpus() > 1 and _table is None:
        import multiprocessing

        # room for the replacements of processes that died, whose slots stay taken until reused
        _table = multiprocessing.Array("i", 4 * processes)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a killed one the pool has not reaped yet does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return True  # no /proc: as kill says


def _mark(value: int) -> None:
    """This process's slot set to ``value`` (its pid: scoring; minus its pid: idle)."""
    pid = os.getpid()
    with _table.get_lock():
        slots = _table.get_obj()
        mine = next((i for i, v in enumerate(slots) if abs(v) == pid), None)
        if mine is None:  # a free slot, else one of a process that is gone
            mine = next((i for i, v in enumerate(slots) if v == 0 or not _alive(abs(v))), None)
        if mine is not None:
            slots[mine] = value


@contextmanager
def scoring() -> Iterator[None]:
    """Around a chunk's work in a process of a gpu worker of several."""
    if _table is None:
        yield
        return
    _mark(os.getpid())
    try:
        yield
    finally:
        _mark(-os.getpid())


def busy() -> int:
    """The processes scoring now (this one included)."""
    pid = os.getpid()
    with _table.get_lock():
        scoring = [v for v in _table.get_obj() if v > 0]
    others = sum(1 for v in scoring if v != pid and _alive(v))
    return others + 1


def fit(device: str) -> None:
    """Before a batch: on a CPU, torch's threads set to the CPUs divided among the processes
    scoring now, at least this process's share (on another device, nothing)."""
    if _table is None or device != "cpu":
        return
    import torch

    cpus, now = shared_cpus(), busy()
    own = max(1, int(os.environ.get("OMP_NUM_THREADS") or 1))
    want = max(own, cpus // now)
    if not _threads or _threads[0] != want:
        torch.set_num_threads(want)
        (log.info if (want, now) not in _said else log.debug)(
            "gpu worker process %d: %d CPU thread(s) while %d of its worker's processes score (its own "
            "share: %d)", os.getpid(), want, now, own)
        _said.add((want, now))
        _threads[:] = [want]
