"""How long a running job has left: the remaining time of its slowest stage (issue 74).

A job's items do not go at one pace: a lexical metric's thousands of items are scored in seconds on
the cpu queue while a judge's go at the pace its budget and its replies allow. A time left from all
items pooled says "5 s left" when the cpu items are done and the judge has a minute to go. Here the
runs that go to the same queues are one stage (``cpu``, ``gpu``, ``judge.lab``, ...): each stage's
items left over its own recent rate, and the job's time left is the longest of them. A stage with
items left that has not moved yet (its chunks wait in line, or for the generation stage) gives no
estimate: none is said rather than a wrong one.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable

WINDOW = 15.0  # seconds: a stage's rate is measured over at least the last this many (or half its run)


def stages(spec) -> dict[str, str]:
    """Run key -> its stage: the queues its chunks go to (a judge spread over regions: each of them)."""
    from evalq.shared.cluster.spec import entry_queues, runs

    return {key: "+".join(sorted(set(entry_queues(entry)))) for key, entry in runs(spec)}


def by_stage(spec, done: dict[str, int]) -> dict[str, tuple[int, int]]:
    """Per stage, (items done, items in all) from the runs' ``done``."""
    from evalq.shared.cluster.spec import run_items, runs

    out: dict[str, tuple[int, int]] = {}
    named = stages(spec)
    for key, entry in runs(spec):
        d, t = out.get(named[key], (0, 0))
        out[named[key]] = (d + done.get(key, 0), t + run_items(spec, key, entry))
    return out


def slowest(stages_now: dict[str, tuple[int, int, float]]) -> tuple[float | None, str | None]:
    """(seconds left, the stage that sets it) from each stage's (done, total, rate in items/s); (None,
    None) while a stage with items left has no rate, or when nothing is left."""
    worst, which = 0.0, None
    for stage, (done, total, rate) in sorted(stages_now.items()):
        if done >= total:
            continue
        if rate <= 0:
            return None, None
        if (total - done) / rate >= worst:
            worst, which = (total - done) / rate, stage
    return (worst, which) if which is not None else (None, None)


def at_once(progress: dict[str, tuple[int, int]], elapsed: float) -> tuple[float | None, str | None]:
    """One look, without a history (``evalq status``): each stage's rate since the job was submitted."""
    return slowest({s: (d, t, d / elapsed if elapsed > 0 else 0.0) for s, (d, t) in progress.items()})


class _Stage:
    """A stage's looks: (time, done) over its recent window, from just before it first moved."""

    def __init__(self, now: float, done: int):
        self.start, self.looks, self.moving = now, deque([(now, done)]), False

    def rate(self, now: float, done: int) -> float:
        if not self.moving:
            if done == self.looks[-1][1]:  # not moved yet: it starts from the latest look
                self.start, self.looks = now, deque([(now, done)])
                return 0.0
            self.moving = True
        self.looks.append((now, done))
        since = now - max(WINDOW, (now - self.start) / 2)
        while len(self.looks) > 2 and self.looks[1][0] <= since:
            self.looks.popleft()
        then, before = self.looks[0]
        return (done - before) / (now - then) if now > then else 0.0


class Eta:
    """Fed each look's progress per stage (``by_stage``), says the time left (``update``)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock, self.seen = clock, {}

    def update(self, progress: dict[str, tuple[int, int]]) -> tuple[float | None, str | None]:
        now = self.clock()
        rates = {}
        for stage, (done, total) in progress.items():
            track = self.seen.setdefault(stage, _Stage(now, done))
            rates[stage] = (done, total, track.rate(now, done))
        return slowest(rates)
