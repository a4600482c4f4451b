"""The cluster's journal: a record of a job's life kept outside Redis, for fault drills, and the
history checker that reads it (issue 72).

With ``EVALQ_JOURNAL`` naming a file, every process of the cluster appends one JSON line per
event to it, with ``time.monotonic()`` (one clock for every process of a machine, untouched by
the wall clock's steps) and the chunk it concerns (``<entry key>:<first position>``):

    enqueue   the orchestrator put a chunk in line (``dispatch.enqueue``: at submission, and
              again for a chunk a resume or a rebuild sends again)
    start     a worker began a chunk (``task``: the Celery task id; ``worker``: its node)
    call      a judge (or the model under test) is about to be paid for an item (``item``: its
              position; a call an earlier run was answered is reused, not logged)
    part      a chunk's record part was written to the job store (``done`` means a part)
    done      the chunk's run ended and was counted (``chunk_finished``)

and a drill adds its own: ``fault`` (what it did, when) and ``alive`` (a worker that answered
``inspect ping`` after it). Unset (the default), every call returns at once.

``check`` reads a journal and says what a fault cost: chunks lost (put in line, never landed:
must be 0), chunks run twice, judge calls paid again and the bound they must keep (the items of
the judge chunks in flight at the fault: started before it, not yet in a part), the time from
the fault to progress again (the first chunk landed by a run begun after the fault; where none had to
begin, the first landed after it), and
the workers that answered after it. Writes are single ``write`` calls on a file opened for
appending, so lines of many processes never interleave.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

JOURNAL_ENV = "EVALQ_JOURNAL"

_fd: tuple[int, str, int] | None = None  # (pid, path, descriptor): a forked child opens its own
_lock = threading.Lock()
_here = threading.local()  # the run of a chunk this thread is in
_runs = itertools.count(1)


def on() -> bool:
    return bool(os.environ.get(JOURNAL_ENV))


def begin(job: str, chunk: str, **fields) -> str:
    """A run of a chunk begins in this thread: its ``start``, and the run's id, which the events
    this thread notes until its next run begins carry (``run``; a judge's item keeper takes it along)."""
    run = f"{os.getpid()}.{next(_runs)}" if on() else ""
    _here.run = run
    note("start", job, chunk, **fields)
    return run


def current() -> str:
    return getattr(_here, "run", "")


def note(event: str, job: str = "", chunk: str = "", **fields) -> None:
    """Append one event to the journal (nothing when ``EVALQ_JOURNAL`` is unset)."""
    path = os.environ.get(JOURNAL_ENV)
    if not path:
        return
    fields.setdefault("run", current())
    line = json.dumps({"t": time.monotonic(), "event": event, "job": job, "chunk": chunk, "pid": os.getpid(),
                       **fields}, separators=(",", ":")) + "\n"
    global _fd
    with _lock:
        if _fd is None or _fd[0] != os.getpid() or _fd[1] != path:
            _fd = (os.getpid(), path, os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600))
        os.write(_fd[2], line.encode())


def chunk_id(key: str, start: int) -> str:
    return f"{key}:{start}"


def read(path: str | Path) -> list[dict]:
    """The journal's events in the order of their times."""
    events = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return sorted(events, key=lambda e: e["t"])


@dataclass
class Verdict:
    """What the journal says a fault cost one job."""

    chunks: int  # chunks put in line (once each)
    lost: list[str]  # put in line, never landed (no part, or no end without a store)
    doubled: dict[str, int]  # chunk -> how many times it landed, where more than once
    calls: int  # judge calls paid
    repaid: int  # calls paid again for an item already called
    in_flight: int  # the bound for ``repaid``: items of the judge chunks running at the fault
    recovered_after: float | None  # seconds from the fault to the first chunk landed by a run begun after it
    alive: set[str] = field(default_factory=set)  # workers that answered after the fault

    @property
    def ok(self) -> bool:
        return not self.lost and self.repaid <= self.in_flight

    def line(self) -> str:
        after = "-" if self.recovered_after is None else f"{self.recovered_after:.1f} s"
        return (f"{self.chunks} chunks, {len(self.lost)} lost, {len(self.doubled)} run twice, "
                f"{self.repaid} judge calls paid again (bound {self.in_flight}), progress again after {after}")


def check(events: Iterable[dict], job: str, fault: str = "fault") -> Verdict:
    """What the journal's events say of job ``job`` and the first event named ``fault``."""
    mine = [e for e in events if e.get("job") in (job, "")]
    at = next((e["t"] for e in mine if e["event"] == fault), None)
    enqueued = {e["chunk"] for e in mine if e["event"] == "enqueue"}
    landed = Counter(e["chunk"] for e in mine if e["event"] == "part")
    ended = {e["chunk"] for e in mine if e["event"] == "done"}
    by_part = bool(landed)  # with a job store done means a part; without one, a run that ended
    lost = sorted(c for c in enqueued if c not in (landed if by_part else ended))
    calls = [(e["chunk"].rsplit(":", 1)[0], e["item"]) for e in mine if e["event"] == "call"]
    repaid = sum(n - 1 for n in Counter(calls).values())
    in_flight, recovered = 0, None
    if at is not None:
        called = {chunk for chunk, _ in calls}
        for chunk, span in _running_at(mine, at).items():
            if chunk.rsplit(":", 1)[0] in called:
                in_flight += span
        # the first chunk landed by a run begun after the fault; where none had to begin (the runs
        # in flight carried the job to its end), the first landed after it
        later = {e["run"] for e in mine if e["event"] == "start" and e["t"] > at}
        firsts = [e["t"] for e in mine if e["event"] in ("part", "done") and e["t"] > at
                  and (not later or e.get("run") in later)]
        recovered = min(firsts) - at if firsts else None
    alive = {e.get("worker", "") for e in mine if e["event"] == "alive" and (at is None or e["t"] > at)}
    return Verdict(len(enqueued), lost, {c: n for c, n in landed.items() if n > 1}, len(calls), repaid, in_flight,
                   recovered, alive)


def _running_at(events: list[dict], at: float) -> dict[str, int]:
    """Chunk -> its items, for every chunk a run of which had begun by ``at`` and had not landed."""
    started = {e["chunk"]: e.get("n", 0) for e in events if e["event"] == "start" and e["t"] <= at}
    landed = {e["chunk"] for e in events if e["event"] in ("part", "done") and e["t"] <= at}
    return {chunk: n for chunk, n in started.items() if chunk not in landed}
