"""Keeping what a paid call bought the moment it is bought, even while Redis is away.

A chunk's records go to ``res:{M}`` with its aggregate part when the chunk ends
(``evalq.workers.chunk``). A judge or generation item costs a call, so each
item's record is kept as soon as the item is scored, under ``kept:{M}``
(``evalq.shared.cluster.keys``), and the replies of an item's answered calls are kept
there before the item pays for another call (a corrective re-ask, say). A chunk
run again (redelivered after its worker died, retried after a Redis error)
reads them back: an item kept is not scored again, and a call answered is not
paid again. Only calls in flight at the moment of a fault are paid twice.

Cost: keeping rides round trips that were made anyway. The judge client hands
its accounting counters here instead of writing them after every call, and an
item's record goes in one pipeline with them; the replies of a several-call
item are written before its next call only (one round trip then, none for an
item of one call); a metric whose replies the job's memo keeps (``memo``) writes
its counters with the memo.

Redis away: a write that fails is held in the process (``WriteBehind``) and
written, in order, by a background thread as soon as Redis answers again; a
chunk run again in this process reads what is held. A process that dies while
holding writes loses them: those calls were in flight when Redis went away
(nothing is paid for while it is away, since every call first reserves budget
in Redis).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any, Iterable

import redis

from evalq.shared.cluster import journal, keys
from evalq.shared.store.records import summed

log = logging.getLogger("evalq.worker")

# a redis-py pipeline method and its positional arguments
Op = tuple[str, tuple]

DOWN = (redis.ConnectionError, redis.TimeoutError)


def execute(r: redis.Redis, ops: list[Op]) -> None:
    """``ops`` in one round trip, all or none (MULTI/EXEC)."""
    pipe = r.pipeline(transaction=True)
    for method, args in ops:
        getattr(pipe, method)(*args)
    pipe.execute()


class WriteBehind:
    """The process's writes that Redis could not take, written when it is back.

    A write made while something is held goes behind it, so writes to the same
    field land in the order they were made. One background thread retries the
    oldest held write with back-off (0.2 s doubling to 2 s) until none is left.
    """

    def __init__(self, first_wait: float = 0.2, longest_wait: float = 2.0):
        self.first_wait, self.longest_wait = first_wait, longest_wait
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._held: list[tuple[redis.Redis, list[Op]]] = []
        self._flusher: threading.Thread | None = None

    def write(self, r: redis.Redis, ops: list[Op]) -> bool:
        """Write ``ops`` now, or hold them; True when they were written now."""
        if not ops:
            return True
        with self._lock:
            self._after_fork()
            if self._held:
                self._hold(r, ops)
                return False
        try:
            execute(r, ops)
            return True
        except DOWN as exc:
            with self._lock:
                if not self._held:
                    log.warning("Redis is unreachable (%s): holding writes until it is back", exc)
                self._hold(r, ops)
            return False

    def held(self, key: str, fields: Iterable[str]) -> dict[str, str]:
        """The newest held value of each of hash ``key``'s ``fields`` that has one."""
        wanted, found = set(fields), {}
        with self._lock:
            self._after_fork()
            for _, ops in self._held:
                for method, args in ops:
                    if method == "hset" and args[0] == key and args[1] in wanted:
                        found[args[1]] = args[2]
        return found

    def pending(self) -> int:
        """How many writes are held."""
        with self._lock:
            self._after_fork()
            return len(self._held)

    def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every held write to be written (a
        worker shutting down); True when none is left."""
        deadline = time.monotonic() + timeout
        while self.pending():
            if time.monotonic() > deadline:
                log.error("Redis did not come back: %d held write(s) are lost with this process", self.pending())
                return False
            time.sleep(0.05)
        return True

    def _hold(self, r: redis.Redis, ops: list[Op]) -> None:
        self._held.append((r, ops))
        if self._flusher is None:
            self._flusher = threading.Thread(target=self._flush, name="evalq-write-behind", daemon=True)
            self._flusher.start()

    def _flush(self) -> None:
        wait = self.first_wait
        while True:
            with self._lock:
                if not self._held:
                    self._flusher = None
                    return
                r, ops = self._held[0]
            try:
                execute(r, ops)
            except DOWN:
                time.sleep(wait)
                wait = min(wait * 2, self.longest_wait)
                continue
            except redis.RedisError as exc:  # not the connection: retrying cannot help
                log.error("a held write was refused by Redis and is dropped: %s", exc)
            with self._lock:
                self._held.pop(0)
                if not self._held:
                    log.warning("Redis is back: held writes written")
            wait = self.first_wait

    def _after_fork(self) -> None:
        # a forked pool child inherits the lists but not the thread
        if self._pid != os.getpid():
            self._pid, self._held, self._flusher = os.getpid(), [], None


WRITE_BEHIND = WriteBehind()


def earlier(r: redis.Redis, records: Any, job_id: str, metric_key: str,
            positions: list[int]) -> tuple[set[int], dict[int, dict]]:
    """What earlier runs of a chunk left: the positions ``records`` (the job's, ``ChunkContext.records``)
    has, and what is kept of the others (in Redis, or held by this process)."""
    fields = [str(p) for p in positions]
    recorded_raw, kept_raw = records.get_many_beside(r, metric_key, positions, keys.kept(job_id, metric_key))
    held = WRITE_BEHIND.held(keys.kept(job_id, metric_key), fields)
    recorded = {p for p, raw in zip(positions, recorded_raw) if raw is not None}
    kept = {}
    for p, f, raw in zip(positions, fields, kept_raw):
        raw = held.get(f, raw)
        if raw is not None and p not in recorded:
            kept[p] = json.loads(raw)
    return recorded, kept


class ItemKeeper:
    """What one chunk run keeps, item by item (one item at a time; a panel's members call from a
    thread each, so what they share is held under a lock).

    The runner calls ``begin`` before scoring an item and ``done`` with its
    record; the judge client asks ``reply`` for a call an earlier run of the
    item had answered, tells ``answered`` about each reply, calls
    ``before_call`` before it pays for a call, and hands its counters to
    ``add``. Everything waits here for the next round trip (``flush``).
    """

    def __init__(self, r: redis.Redis, job_id: str, metric_key: str, positions: list[int],
                 replies: dict[int, dict[str, str]], ttl: int, write_behind: WriteBehind | None = None,
                 chunk: str = "", accounts: dict[int, dict[str, int]] | None = None):
        self.r = r
        self.job_id, self.chunk, self.run = job_id, chunk, journal.current()  # for the cluster's journal
        self.write_behind = write_behind or WRITE_BEHIND
        self.key = keys.kept(job_id, metric_key)
        self.expiring = [self.key, keys.accounting(job_id, metric_key)]
        # what each item's calls counted on the entry's accounting (an earlier run's too: ``accounts``),
        # kept with the item and summed into the chunk's part (what a rebuild counts again)
        self.earlier_accounts = accounts or {}
        self.accounts: dict[int | None, dict[str, int]] = {}
        self.positions = positions
        self.earlier = replies  # position -> {sha: reply} an earlier run kept
        self.ttl = ttl
        self.ops: list[Op] = []
        self.position: int | None = None
        self.replies: dict[str, str] = {}
        self.unkept = False
        self._lock = threading.RLock()

    def begin(self, index: int) -> None:
        self.position = self.positions[index]
        self.replies = dict(self.earlier.get(self.position, {}))
        if self.position in self.earlier_accounts:
            self.accounts[self.position] = dict(self.earlier_accounts[self.position])
        self.unkept = False

    def reply(self, digest: str) -> str | None:
        """The reply an earlier run of this item was given for request ``digest``."""
        with self._lock:
            return self.replies.get(digest) if self.position is not None else None

    def answered(self, digest: str, raw: str) -> None:
        with self._lock:
            if self.position is not None:
                self.replies[digest] = raw
                self.unkept = True

    def before_call(self) -> None:
        """The item's answered calls are kept before it pays for another."""
        journal.note("call", self.job_id, self.chunk, item=self.position, run=self.run)
        with self._lock:
            if self.unkept:
                self._keep({"replies": self.replies, **self._counted()})
                self.flush()

    def add(self, ops: list[Op]) -> None:
        with self._lock:
            self.ops += ops
            self._account(ops)

    def done(self, record: dict) -> None:
        if self.position is None:
            return
        self._keep({"record": record, **self._counted()})
        self.flush()
        self.position = None

    def flush(self, *ops: Op) -> bool:
        """Write what waits (and ``ops``) in one round trip, or have it held; True when written now."""
        with self._lock:
            self._account(ops)
            batch, self.ops = self.ops + list(ops), []
        if not batch:
            return True
        batch += [("expire", (key, self.ttl)) for key in self.expiring]
        return self.write_behind.write(self.r, batch)

    def chunk_accounting(self, kept: dict[int, dict]) -> dict[str, int]:
        """What every call of the chunk's items counted, this run's and earlier runs' (``kept``: what
        they kept, ``earlier``'s), summed: the chunk's part carries it."""
        counted = [k["acct"] for k in kept.values() if "record" in k and isinstance(k.get("acct"), dict)]
        with self._lock:
            counted += list(self.accounts.values())
        return summed(counted)

    def _account(self, ops: Iterable[Op]) -> None:
        for name, args in ops:
            if name == "hincrby" and args[0] == self.expiring[1]:
                mine = self.accounts.setdefault(self.position, {})
                mine[args[1]] = mine.get(args[1], 0) + int(args[2])

    def _counted(self) -> dict:
        counts = self.accounts.get(self.position)
        return {"acct": dict(counts)} if counts else {}

    def _keep(self, value: dict) -> None:
        self.ops.append(("hset", (self.key, str(self.position), json.dumps(value, ensure_ascii=False))))
        self.unkept = False
