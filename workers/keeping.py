"""Keeping what a paid call bought the moment it is bought, even while Redis is away.

A chunk's records go to ``res:{M}`` with its aggregate part when the chunk ends
(``evalq.workers.chunk``). A judge or generation item costs a call, so each
item's record is kept as soon as the item is scored, under ``kept:{M}``
(``evalq.shared.cluster.keys``), and the replies of an item's answered calls are kept
there before the item pays for another call (a corrective re-ask, say). A chunk
run again (redelivered after its worker died, retried after a Redis error)
reads them back: an item kept is not scored again, and a call answered is not
paid again. Only calls in flight at the moment of a fault are paid twice, and (a judge client's
keeper, ``carrying``) an item whose record waits for its thread's next admission: at most one a
thread, never while that thread has a call in flight.

Cost: one command an item, and no round trip of its own where a judge client admits its calls with
what waits (``carried``): an item's record (or, before it pays for another call, its answered
calls) is one HSET, the kept hash's expiry set once a run; the judge client hands its accounting
counters here, summed in the process and added once a run (``ItemKeeper.closing``), in the chunk's
own transaction; a metric whose replies the job's memo keeps (``memo``) writes them with the memo.

Redis away: a write that fails is held in the process (``WriteBehind``) and
written, in order, by a background thread as soon as Redis answers again; a
chunk run again in this process reads what is held. A process that dies while
holding writes loses them: those calls were in flight when Redis went away
(nothing is paid for while it is away, since every call first reserves budget
in Redis).
"""

from __future__ import annotations

import contextvars
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


def execute(r: redis.Redis, ops: list[Op], transaction: bool = True) -> None:
    """``ops`` in one round trip, all or none (MULTI/EXEC, where ``transaction`` and there are several).
    An op ``("script", (script, keys, args))`` runs a registered script by its digest; one the server
    does not know (a Redis restarted since) is loaded and run again alone."""
    pipe = r.pipeline(transaction=transaction and len(ops) > 1)
    _queue(pipe, ops)
    if not any(method == "script" for method, _ in ops):
        pipe.execute()
        return
    failed = _reloaded(ops, pipe.execute(raise_on_error=False))
    if failed:
        raise failed[0]


def run_after(r: redis.Redis, ops: list[Op], script: Any, script_keys: list, script_args: list) -> Any:
    """``ops`` (an item's record, a call's settling: ``ItemKeeper.carried``), then registered ``script``
    (a call's admission), in one round trip without a transaction; the script's result. An op that
    fails is logged and does not stop the script: what an item keeps is for a run again after a
    fault, its chunk's records are written whole at its end."""
    pipe = r.pipeline(transaction=False)
    _queue(pipe, ops)
    pipe.evalsha(script.sha, len(script_keys), *script_keys, *script_args)
    *done, result = pipe.execute(raise_on_error=False)
    for failed in _reloaded(ops, done):
        log.warning("a kept write that rode a call's admission failed: %s", failed)
    if isinstance(result, redis.exceptions.NoScriptError):
        return script(keys=script_keys, args=script_args)
    if isinstance(result, Exception):
        raise result
    return result


def _queue(pipe: Any, ops: list[Op]) -> None:
    """Queue ``ops`` on ``pipe``: a script op by its digest."""
    for method, args in ops:
        if method == "script":
            script, script_keys, script_args = args
            pipe.evalsha(script.sha, len(script_keys), *script_keys, *script_args)
        else:
            getattr(pipe, method)(*args)


def _reloaded(ops: list[Op], results: list) -> list[Exception]:
    """Each script op the server did not know run again alone (which loads it); the other errors of
    ``results`` (the pipeline's, one per op), in order."""
    failed = []
    for (method, args), result in zip(ops, results):
        if isinstance(result, redis.exceptions.NoScriptError) and method == "script":
            script, script_keys, script_args = args
            script(keys=script_keys, args=script_args)
        elif isinstance(result, Exception):
            failed.append(result)
    return failed


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
        self._held: list[tuple[redis.Redis, list[Op], bool]] = []
        self._flusher: threading.Thread | None = None

    def write(self, r: redis.Redis, ops: list[Op], transaction: bool = True) -> bool:
        """Write ``ops`` now, or hold them; True when they were written now (``transaction``: all or none)."""
        if not ops:
            return True
        with self._lock:
            self._after_fork()
            if self._held:
                self._hold(r, ops, transaction)
                return False
        try:
            execute(r, ops, transaction)
            return True
        except DOWN as exc:
            with self._lock:
                if not self._held:
                    log.warning("Redis is unreachable (%s): holding writes until it is back", exc)
                self._hold(r, ops, transaction)
            return False

    def held(self, key: str, fields: Iterable[str]) -> dict[str, str]:
        """The newest held value of each of hash ``key``'s ``fields`` that has one."""
        wanted, found = set(fields), {}
        with self._lock:
            self._after_fork()
            for _, ops, _ in self._held:
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

    def _hold(self, r: redis.Redis, ops: list[Op], transaction: bool = True) -> None:
        self._held.append((r, ops, transaction))
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
                r, ops, transaction = self._held[0]
            try:
                execute(r, ops, transaction)
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


class _Item:
    """One item's state in a chunk run: its answered calls, and what they counted."""

    def __init__(self, position: int, replies: dict[str, str], acct: dict[str, int], fresh: dict[str, int]):
        self.position, self.replies, self.acct, self.fresh = position, replies, acct, fresh
        self.unkept = False


_ITEM: contextvars.ContextVar[_Item | None] = contextvars.ContextVar("evalq_kept_item", default=None)


def _add(counts: dict[str, int], field: str, value: int) -> None:
    counts[field] = counts.get(field, 0) + value


class ItemKeeper:
    """What one chunk run keeps, item by item. The items of a chunk may be scored side by side (a
    thread each) and a panel's members call from a thread each: an item's own state rides in a
    context variable (``begin`` sets it; a panel's member threads run in a copy of it), what they
    share is held under a lock.

    The runner calls ``begin`` before scoring an item and ``done`` with its
    record; the judge client asks ``reply`` for a call an earlier run of the
    item had answered, tells ``answered`` about each reply, calls
    ``before_call`` before it pays for a call, and hands its counters to
    ``add``. An item's record (or its answered calls) is one HSET; the expiry is set once a run.

    Accounting (``keys.accounting``) is added once a run, not once a call: ``closing`` gives the
    sums of what this run's calls counted, and of what items kept by earlier runs that never got
    to add theirs (a worker killed) counted, with the runs they name marked as counted
    (``keys.accounted``), to ride the chunk's own transaction. Each kept item carries its run and
    what it counted that is not added yet (``fresh``), so nothing is added twice and nothing paid
    is left out.
    """

    def __init__(self, r: redis.Redis, job_id: str, metric_key: str, positions: list[int],
                 replies: dict[int, dict[str, str]], ttl: int, write_behind: WriteBehind | None = None,
                 chunk: str = "", accounts: dict[int, dict[str, int]] | None = None,
                 kept: dict[int, dict] | None = None):
        import uuid

        self.r = r
        self.job_id, self.chunk, self.run = job_id, chunk, journal.current()  # for the cluster's journal
        self.run_id = uuid.uuid4().hex[:16]
        self.write_behind = write_behind or WRITE_BEHIND
        self.key = keys.kept(job_id, metric_key)
        self.acct_key, self.accounted_key = keys.accounting(job_id, metric_key), keys.accounted(job_id, metric_key)
        # what each item's calls counted (an earlier run's too: ``accounts``), kept with the item and
        # summed into the chunk's part (what a rebuild counts again)
        self.earlier_accounts = accounts or {}
        self.accounts: dict[int | None, dict[str, int]] = {}
        self.positions = positions
        self.earlier = replies  # position -> {sha: reply} an earlier run kept
        self.ttl = ttl
        self.ops: list[Op] = []
        self.counts: dict[str, int] = {}  # what this run's calls counted, not yet added
        self.inherited, self.uncounted = self._uncounted(kept or {})
        self._expiring = True  # the kept hash's expiry: set with the run's first write
        self._taken = 0  # how often what waits was written (a thread's record waits for its next call)
        self.carrying = False  # a judge client admits its calls with what waits (``carried``)
        self._waiting = threading.local()  # per thread: ``_taken`` when its record last waited
        self._closers: list = []
        self._lock = threading.RLock()

    def _uncounted(self, kept: dict[int, dict]) -> tuple[dict[int, dict[str, int]], set[str]]:
        """What items kept by earlier runs counted that no run added to the accounting yet (their
        run never closed), by position; and those runs."""
        runs = sorted({k["run"] for k in kept.values() if isinstance(k.get("run"), str)})
        if not runs:  # none, or kept by an older worker, which added each item's counts as it kept it
            return {}, set()
        marked = self.r.hmget(self.accounted_key, runs)
        held = self.write_behind.held(self.accounted_key, runs)  # marked while Redis was away
        open_runs = {run for run, mark in zip(runs, marked) if mark is None and run not in held}
        inherited = {p: dict(k.get("fresh") or {}) for p, k in kept.items() if k.get("run") in open_runs}
        return inherited, open_runs

    @property
    def position(self) -> int | None:
        item = _ITEM.get()
        return item.position if item is not None else None

    def begin(self, index: int) -> None:
        position = self.positions[index]
        acct = dict(self.earlier_accounts.get(position, {}))
        with self._lock:
            if acct:
                self.accounts[position] = acct
            fresh = dict(self.inherited.get(position, {}))
        _ITEM.set(_Item(position, dict(self.earlier.get(position, {})), acct, fresh))

    def reply(self, digest: str) -> str | None:
        """The reply an earlier run of this item was given for request ``digest``."""
        item = _ITEM.get()
        with self._lock:
            return item.replies.get(digest) if item is not None else None

    def answered(self, digest: str, raw: str) -> None:
        item = _ITEM.get()
        with self._lock:
            if item is not None:
                item.replies[digest] = raw
                item.unkept = True

    def before_call(self, carry: bool = False) -> None:
        """The item's answered calls are kept before it pays for another: at once, or (``carry``: the
        call's admission comes next and takes ``carried``) in the admission's own round trip."""
        item = _ITEM.get()
        journal.note("call", self.job_id, self.chunk, item=item.position if item else None, run=self.run)
        with self._lock:
            if item is not None and item.unkept:
                self._keep(item, {"replies": item.replies})
        if not carry:
            self.flush()

    def carried(self) -> list[Op]:
        """What waits (records, settlings), to be written ahead of a call's admission in its round trip
        (``run_after``): an item's record is kept before its thread pays for another call, without a
        round trip of its own. Nothing while this process holds writes Redis could not take: what
        waits then goes behind them (``flush``)."""
        with self._lock:
            if not self.ops:
                return []
            if not self.write_behind.pending():
                return self._take()
        self.flush()
        return []

    def hold(self, ops: list[Op]) -> None:
        """``carried`` ops whose round trip failed: written when Redis is back (or now)."""
        self.write_behind.write(self.r, ops, transaction=False)

    def add(self, ops: list[Op]) -> None:
        """Ops for the next round trip; the accounting's counters are summed here instead, added
        when the run closes (``closing``)."""
        item = _ITEM.get()
        with self._lock:
            for name, args in ops:
                if name == "hincrby" and args[0] == self.acct_key:
                    field, value = args[1], int(args[2])
                    _add(self.counts, field, value)
                    if item is not None:
                        _add(item.acct, field, value)
                        _add(item.fresh, field, value)
                        self.accounts[item.position] = item.acct
                else:
                    self.ops.append((name, args))

    def done(self, record: dict) -> None:
        """The item's record, kept now; or, where a judge client carries what waits (``carrying``), in
        the admission of its thread's next call (``carried``), unless a record of this thread already
        waits (its last item paid for no call): then both go now. So a thread has at most one item
        unkept, and then no call in flight: a worker killed pays again for no more items than it has
        threads."""
        item = _ITEM.get()
        if item is None:
            return
        waiting = self._waiting
        with self._lock:
            self._keep(item, {"record": record})
            now = not self.carrying or getattr(waiting, "at", None) == self._taken
            waiting.at = self._taken
        if now:
            self.flush()
        _ITEM.set(None)

    def _take(self, ops: tuple = ()) -> list[Op]:
        """What waits (and ``ops``), taken to be written, with the kept hash's expiry the first time
        (under the lock)."""
        batch, self.ops = self.ops + list(ops), []
        if batch:
            self._taken += 1
        if batch and self._expiring and any(args[0] == self.key for _, args in batch):
            batch.append(("expire", (self.key, self.ttl)))
            self._expiring = False
        return batch

    def flush(self, *ops: Op) -> bool:
        """Write what waits (and ``ops``) in one round trip, or have it held; True when written now."""
        with self._lock:
            batch = self._take(ops)
        if not batch:
            return True
        # (no transaction: an item kept, a call settled, a version told stand alone)
        return self.write_behind.write(self.r, batch, transaction=False)

    def on_close(self, step) -> None:
        """``step`` runs when the chunk run ends (a judge client folds what it saw)."""
        self._closers.append(step)

    def closing(self) -> list[Op]:
        """At the end of the run: what it adds to the entry's accounting (its calls' counts, and those
        of earlier runs' kept items that were never added), with those runs marked as added."""
        for step in self._closers:
            try:
                step()
            except DOWN as exc:
                log.info("a judge client's closing step skipped, Redis is unreachable: %s", exc)
        with self._lock:
            total = summed([self.counts, *self.inherited.values()])
            runs, self.counts, self.inherited = self.uncounted | {self.run_id}, {}, {}
        ops: list[Op] = [("hincrby", (self.acct_key, name, value)) for name, value in total.items() if value]
        if ops or self.uncounted:
            ops += [("hset", (self.accounted_key, run, 1)) for run in sorted(runs)]
            ops += [("expire", (key, self.ttl)) for key in (self.acct_key, self.accounted_key)]
        return ops

    def chunk_accounting(self, kept: dict[int, dict]) -> dict[str, int]:
        """What every call of the chunk's items counted, this run's and earlier runs' (``kept``: what
        they kept, ``earlier``'s), summed: the chunk's part carries it."""
        counted = [k["acct"] for k in kept.values() if "record" in k and isinstance(k.get("acct"), dict)]
        with self._lock:
            counted += list(self.accounts.values())
        return summed(counted)

    def _keep(self, item: _Item, value: dict) -> None:
        if item.acct:
            value["acct"] = dict(item.acct)
        value["run"] = self.run_id
        if item.fresh:
            value["fresh"] = dict(item.fresh)
        self.ops.append(("hset", (self.key, str(item.position), json.dumps(value, ensure_ascii=False))))
        item.unkept = False
