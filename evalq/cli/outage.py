"""A client that waits on a job (``evalq run --broker``, ``wait``, ``status``) rides
out Redis going away: a restart (its AOF brings the job back), a failover, a
network blip. It says once that Redis is unreachable, tries again with back-off
(0.5 s doubling to 5 s), says when Redis is back, and gives up, as an
``InfraError`` (one line, exit 1), only when Redis stays away longer than the
client would wait for progress. Every Redis access such a client makes goes
through ``Outage.call``; a step that failed halfway is simply taken again, so
each must be safe to repeat (reads, and the lookers-after's claimed steps).
"""

from __future__ import annotations

import sys
import time
from typing import Callable, TypeVar

from evalq.shared.core.config import safe_url
from evalq.shared.core.errors import InfraError

T = TypeVar("T")


def away(exc: BaseException) -> bool:
    """Redis (or the broker connection kombu holds to it) cannot be reached just now.
    A refused password is not an outage: waiting would not help."""
    import kombu.exceptions
    import redis

    if isinstance(exc, (redis.AuthenticationError, redis.exceptions.AuthorizationError)):
        return False
    return isinstance(exc, (redis.ConnectionError, redis.TimeoutError, kombu.exceptions.OperationalError,
                            ConnectionError))


class Outage:
    """How long Redis has been away, for one waiting client."""

    def __init__(self, broker_url: str, limit: float, first_wait: float = 0.5, longest_wait: float = 5.0,
                 say: Callable[[str], None] | None = None):
        self.where = safe_url(broker_url)
        self.limit = limit
        self.first_wait, self.longest_wait = first_wait, longest_wait
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.since: float | None = None  # when the present outage began (monotonic)
        self.ended_at = float("-inf")  # when the last one ended
        self._wait = first_wait

    def call(self, step: Callable[..., T], *args, **kwargs) -> T:
        """``step(*args, **kwargs)``, taken again while Redis is away, up to ``limit`` seconds."""
        while True:
            try:
                result = step(*args, **kwargs)
            except Exception as exc:
                if not away(exc):
                    raise
                self._lost(exc)
                continue
            if self.since is not None:
                self.say(f"evalq: Redis at {self.where} is back after {time.monotonic() - self.since:.0f} s")
                self.since, self.ended_at = None, time.monotonic()
            return result

    def _lost(self, exc: BaseException) -> None:
        now = time.monotonic()
        reason = str(exc) or type(exc).__name__
        if self.since is None:
            self.since, self._wait = now, self.first_wait
            self.say(f"evalq: Redis at {self.where} is unreachable ({reason}); waiting up to "
                     f"{self.limit:.0f} s for it")
        elif now - self.since >= self.limit:
            raise InfraError(f"Redis at {self.where} has been unreachable for {now - self.since:.0f} s "
                             f"({reason})") from None
        time.sleep(max(0.0, min(self._wait, self.since + self.limit - now)))
        self._wait = min(self._wait * 2, self.longest_wait)
