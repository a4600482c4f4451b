"""Leases in Redis: a key that one holder's token owns for a while, renewed while it works and
released only by that holder (a lease that expired and was taken by another is not theirs to
touch). The queue dispatchers, the batch managers and the stage callbacks hold them."""

from __future__ import annotations

import logging
import threading
import uuid

import redis

log = logging.getLogger("evalq.leases")

# KEYS: lease; ARGV: token. Delete the lease only while the token holds it.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# KEYS: lease; ARGV: token, ms. Extend the lease only while the token holds it.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""


def release(r: redis.Redis, key: str, token: str) -> bool:
    return bool(r.eval(_RELEASE, 1, key, token))


def renew(r: redis.Redis, key: str, token: str, ms: int) -> bool:
    return bool(r.eval(_RENEW, 1, key, token, str(ms)))


class Lease:
    """A lease held for the length of a piece of work: ``acquire`` takes it when nobody holds
    it, a thread renews it every third of ``seconds`` while the work runs, and ``release`` (or
    leaving the ``with`` block) gives it back. A holder that dies stops renewing: the lease
    lapses ``seconds`` later, and whoever looks after the work may start it again."""

    def __init__(self, r: redis.Redis, key: str, seconds: float, owner: str = ""):
        self.r, self.key = r, key
        self.ms = max(1000, int(seconds * 1000))
        self.token = f"{owner}:{uuid.uuid4().hex}" if owner else uuid.uuid4().hex
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> bool:
        if not self.r.set(self.key, self.token, nx=True, px=self.ms):
            return False
        self._thread = threading.Thread(target=self._keep, name="evalq-lease", daemon=True)
        self._thread.start()
        return True

    def _keep(self) -> None:
        while not self._stop.wait(self.ms / 3000):
            try:
                if not renew(self.r, self.key, self.token, self.ms):
                    log.warning("lease %s: lost (it lapsed, or Redis lost it); the work goes on", self.key)
                    return
            except redis.RedisError as exc:  # Redis away for a moment: the next renewal tries again
                log.info("lease %s: could not renew (%s)", self.key, exc)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        try:
            release(self.r, self.key, self.token)
        except redis.RedisError as exc:  # it lapses on its own
            log.info("lease %s: not released (%s); it lapses in %d ms", self.key, exc, self.ms)

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc) -> None:
        self.release()
