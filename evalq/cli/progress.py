"""How a waiting client shows a job's progress: a bar on a terminal, and where there is none (a
CronJob's or a CI job's log) a line every ``EVALQ_PROGRESS_EVERY`` seconds (30 by default): items
done of the total, the rate and the time left, so a log shows a night's job moving. The time left is
the slowest stage's (``evalq.orchestrator.eta``: a judge's minute to go is not hidden by the cpu
items done in seconds), said only once there is an estimate."""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Callable, Iterator

EVERY_ENV = "EVALQ_PROGRESS_EVERY"


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class Lines:
    """``update(done)`` prints a line when ``every`` seconds passed since the last one; ``eta(left,
    stage)`` says the time left."""

    def __init__(self, total: int, every: float, label: str = "evalq", out=None,
                 clock: Callable[[], float] = time.monotonic):
        self.total, self.every, self.label, self.out, self.clock = total, every, label, out or sys.stderr, clock
        self.start = self.last = clock()
        self.done, self.left, self.stage = 0, None, None

    def line(self) -> str:
        elapsed = self.clock() - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        share = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        return (f"{self.label}: {self.done:,}/{self.total:,} items{share}, {rate:,.1f} items/s, "
                f"{_duration(elapsed)} elapsed{_left(self.left, self.stage) if self.done < self.total else ''}")

    def eta(self, left: float | None, stage: str | None) -> None:
        self.left, self.stage = left, stage

    def __call__(self, done: int) -> None:
        self.done = max(self.done, done)
        now = self.clock()
        if now - self.last >= self.every:
            self.last = now
            print(self.line(), file=self.out, flush=True)


def _left(left: float | None, stage: str | None) -> str:
    return f", {_duration(left)} left ({stage}, the slowest stage)" if left is not None else ""


class _Quiet:
    def __call__(self, done: int) -> None:
        pass

    def eta(self, left: float | None, stage: str | None) -> None:
        pass


class _Bar:
    """A tqdm bar whose time left is the slowest stage's, not tqdm's from the pooled rate."""

    def __init__(self, total: int, label: str):
        from tqdm import tqdm

        self.bar = tqdm(total=total, unit="item", desc=label, file=sys.stderr, dynamic_ncols=True, smoothing=0.1,
                        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}, {rate_fmt}{postfix}]")

    def __call__(self, done: int) -> None:
        if done > self.bar.n:
            self.bar.update(done - self.bar.n)

    def eta(self, left: float | None, stage: str | None) -> None:
        self.bar.set_postfix_str(_left(left, stage)[2:], refresh=False)


@contextlib.contextmanager
def progress(total: int, enabled: bool = True, label: str = "evalq") -> Iterator[Lines | _Bar | _Quiet]:
    """An ``update(done)`` (with ``eta(left, stage)``) for a waiting loop: a tqdm bar on a terminal,
    lines elsewhere, nothing when not ``enabled`` (``-q``)."""
    from evalq.shared.core.config import env_number

    if not enabled:
        yield _Quiet()
        return
    if not sys.stderr.isatty():
        lines = Lines(total, float(env_number(EVERY_ENV, 30.0)), label)
        yield lines
        if lines.last > lines.start:  # it printed along the way: where it ended too
            print(lines.line(), file=sys.stderr, flush=True)
        return
    bar = _Bar(total, label)
    try:
        yield bar
    finally:
        bar.bar.close()
