"""How a waiting client shows a job's progress: a bar on a terminal, and where there is none (a
CronJob's or a CI job's log) a line every ``EVALQ_PROGRESS_EVERY`` seconds (30 by default): items
done of the total, the rate and the time left, so a log shows a night's job moving."""

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
    """``update(done)`` prints a line when ``every`` seconds passed since the last one."""

    def __init__(self, total: int, every: float, label: str = "evalq", out=None,
                 clock: Callable[[], float] = time.monotonic):
        self.total, self.every, self.label, self.out, self.clock = total, every, label, out or sys.stderr, clock
        self.start = self.last = clock()
        self.done = 0

    def line(self) -> str:
        elapsed = self.clock() - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        share = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        left = f", {_duration((self.total - self.done) / rate)} left" if rate > 0 and self.done < self.total else ""
        return (f"{self.label}: {self.done:,}/{self.total:,} items{share}, {rate:,.1f} items/s, "
                f"{_duration(elapsed)} elapsed{left}")

    def __call__(self, done: int) -> None:
        self.done = max(self.done, done)
        now = self.clock()
        if now - self.last >= self.every:
            self.last = now
            print(self.line(), file=self.out, flush=True)


@contextlib.contextmanager
def progress(total: int, enabled: bool = True, label: str = "evalq") -> Iterator[Callable[[int], None]]:
    """An ``update(done)`` for a waiting loop: a tqdm bar on a terminal, lines elsewhere, nothing
    when not ``enabled`` (``-q``)."""
    from evalq.shared.core.config import env_number

    if not enabled:
        yield lambda done: None
        return
    if not sys.stderr.isatty():
        lines = Lines(total, float(env_number(EVERY_ENV, 30.0)), label)
        yield lines
        if lines.last > lines.start:  # it printed along the way: where it ended too
            print(lines.line(), file=sys.stderr, flush=True)
        return
    from tqdm import tqdm

    bar = tqdm(total=total, unit="item", desc=label, file=sys.stderr, dynamic_ncols=True, smoothing=0.1)

    def update(done: int) -> None:
        if done > bar.n:
            bar.update(done - bar.n)

    try:
        yield update
    finally:
        bar.close()
