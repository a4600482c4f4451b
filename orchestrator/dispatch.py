"""Dispatch in windows: a queue's broker list holds only what its consumers can start soon,
and which job's chunk goes next is chosen fairly.

A stage's chunks are not sent as messages at once. ``enqueue`` puts them, in plan order,
into the job's pending list for each queue (``evalq:{J}:pending:{Q}``, small JSON
descriptors: a million-item judge job is 250,000 of them, a few MiB in Redis instead of
hundreds of MiB of messages) and marks the job active on the queue. ``refill(Q)`` then
sends chunks while the queue has room: the chunks out on it (queued on its list, reserved
or running in a worker: ``evalq:sched:{Q}:out``) stay below its window, ``factor`` (1) x the
slots of the workers consuming it (each worker announces its slots, ``announce``), at
least ``floor`` (``evalq.shared.cluster.scheduling.Window``). A finished chunk frees its slot and
refills its queue; so do a cancel, and every sweep of the ``evalq.jobs`` role (which also
re-counts ``out`` from the broker, so a lost message or a refill cut short costs nothing).

The choice, chunk by chunk: strict precedence of priority classes (high, normal, low) for
chunks not yet started (a running chunk is never pre-empted); within the class, the tenant
with the least virtual time, then that tenant's job with the least; sending a chunk adds its
cost / weight to both (start-time fair queueing). Cost is what the queue is short of:
tokens on judge and generate queues (the entry's measured tokens per item, else its
``max_tokens`` plus a prompt estimate), seconds on cpu and gpu queues (the entry's measured
seconds per item, else one unit per item). A tenant (or job) that becomes active starts at
the least virtual time of those active, so a share nobody uses goes to the others and
nobody banks credit while idle: one job alone gets the whole queue. A tenant's
``max_share`` caps its tokens per minute on a judge queue to that share of the queue's
TPM. A job whose chunks wait for its own or its tenant's limit gives its slots back meanwhile
(``evalq.orchestrator.holding``): held, it is passed by until its wait is over. Descriptors are
read, sent, then trimmed: a dispatcher that dies midway sends a chunk twice at worst (chunks are
idempotent), never loses one. What a chunk costs: ``evalq.orchestrator.pricing``.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass

import redis

from evalq.orchestrator import holding, pricing
from evalq.shared.cluster import journal, keys, leases
from evalq.shared.cluster.scheduling import PRIORITIES, Tenants, Window
from evalq.shared.cluster.spec import entry_queues, plan
from evalq.shared.job.stored import StoredJob, as_stored, stored_job
from evalq.shared.cluster.status import FINAL

log = logging.getLogger("evalq.dispatch")

LOCK_MS = 15_000
SLOTS_TTL = 30.0  # seconds a worker's announcement of its slots counts
SHARE_WINDOW = pricing.SHARE_WINDOW
PUSH_BATCH = 1000


# --- putting a stage's chunks in line ------------------------------------------------------

def enqueue(r: redis.Redis, job_id: str, spec: StoredJob | dict, stage: str,
            skip_done: bool = False) -> tuple[set[str], int]:
    """Put the stage's chunks into the job's pending lists, from where an earlier call stopped
    (``S:sent`` counts chunks put in line); returns the queues touched and how many chunks
    were put in line. With ``skip_done``
    (resume) the pending lists are rebuilt from every chunk not finished."""
    spec = as_stored(spec, job_id)
    pkey = keys.plan(job_id)
    already = 0 if skip_done else int(r.hget(pkey, f"{stage}:sent") or 0)
    done = r.smembers(keys.chunks_done(job_id, stage)) if skip_done else set()
    queues: set[str] = set()
    if skip_done:
        r.delete(*[keys.pending(job_id, q) for q in stage_queues(spec, stage)])
    position, batch, count = 0, [], 0

    def flush() -> None:
        pipe = r.pipeline(transaction=False)
        for c in batch:
            pipe.rpush(keys.pending(job_id, c.queue), json.dumps([c.metric_key, c.start, c.stop, c.deployment]))
        for q in {c.queue for c in batch}:
            pipe.sadd(keys.sched(q, "jobs"), job_id)
            pipe.sadd(keys.SCHED_QUEUES, q)
            pipe.expire(keys.pending(job_id, q), spec.ttl)
        pipe.hset(pkey, f"{stage}:sent", max(position, int(r.hget(pkey, f"{stage}:sent") or 0)))
        pipe.execute()
        if journal.on():
            for c in batch:
                journal.note("enqueue", job_id, journal.chunk_id(c.metric_key, c.start), queue=c.queue)
        queues.update(c.queue for c in batch)
        batch.clear()

    for position, c in enumerate(plan(spec, stage), start=1):
        if position <= already or c.id.encode() in done:
            continue
        batch.append(c)
        count += 1
        if len(batch) >= PUSH_BATCH:
            flush()
    if batch:
        flush()
    r.hset(pkey, f"{stage}:sent", max(position, int(r.hget(pkey, f"{stage}:sent") or 0)))
    return queues, count


def stage_queues(spec: dict, stage: str) -> set[str]:
    from evalq.shared.cluster.spec import stage_runs

    return {q for _, entry in stage_runs(spec, stage) for q in entry_queues(entry)}


def drop(r: redis.Redis, job_id: str, spec: dict) -> set[str]:
    """Take a job out of line (cancelled): its pending chunks are never sent, and its messages
    still on the queues' lists (a window's worth at most) are taken off, so its slots go to the
    other jobs at once."""
    from evalq.orchestrator.broker import Unreadable, message_job
    from evalq.shared.cluster.spec import runs

    queues = {q for _, entry in runs(spec) for q in entry_queues(entry)}
    pipe = r.pipeline(transaction=False)
    for q in queues:
        pipe.delete(keys.pending(job_id, q))
        pipe.srem(keys.sched(q, "jobs"), job_id)
        pipe.hdel(keys.sched(q, "vt"), f"job:{job_id}")
    pipe.execute()
    for q in queues:
        taken = 0
        for raw in r.lrange(q, 0, -1):
            try:
                ours = message_job(raw) == job_id
            except Unreadable:
                continue
            if ours:
                taken += r.lrem(q, 1, raw)
        if taken and r.decrby(keys.sched(q, "out"), taken) < 0:
            r.set(keys.sched(q, "out"), 0)
    return queues


# --- the window ------------------------------------------------------------------------------

def announce(r: redis.Redis, worker: str, queues: list[str], slots: int) -> None:
    """A worker says how many chunks it runs at once on each queue it consumes."""
    now = time.time()
    pipe = r.pipeline(transaction=False)
    for q in queues:
        pipe.hset(keys.sched(q, "slots"), worker, f"{slots} {now}")
        pipe.expire(keys.sched(q, "slots"), int(SLOTS_TTL * 10))
    pipe.execute()


def slots(r: redis.Redis, queue: str, now: float | None = None) -> int:
    now = time.time() if now is None else now
    total = 0
    for raw in r.hvals(keys.sched(queue, "slots")):
        count, _, at = raw.decode().partition(" ")
        if now - float(at or 0) <= SLOTS_TTL:
            total += int(count)
    return total


def window(r: redis.Redis, queue: str) -> int:
    return Window.from_env().size(slots(r, queue))


def chunk_done(r: redis.Redis, queue: str) -> None:
    """A chunk sent on ``queue`` finished (or was dropped unrun): its slot is free."""
    if r.decr(keys.sched(queue, "out")) < 0:
        r.set(keys.sched(queue, "out"), 0)


# --- choosing ----------------------------------------------------------------------------------

@dataclass
class _Candidate:
    job_id: str
    rank: int
    tenant: str
    weight: float
    pending: list[list]  # descriptors, in order
    taken: int = 0


def refill(app, r: redis.Redis, queue: str) -> int:
    """Send chunks on ``queue`` while it has room, fairly; returns how many were sent.
    One dispatcher per queue at a time (a lock). A caller that finds it taken leaves a mark
    (``again``) and returns at once; the holder looks at the room once more for every mark,
    so a slot freed while it worked is never left empty (many threads finish at once)."""
    token = _hold(r, queue, mark=True)
    if token is None:
        return 0
    try:
        sent = 0
        for _ in range(64):  # bounded: each pass sends, or finds no room or nobody in line
            sent += _fill_room(app, r, queue, int(r.get(keys.sched(queue, "out")) or 0))
            if not r.delete(keys.sched(queue, "again")):
                break
        _backlog(r, queue)
        return sent
    finally:
        leases.release(r, keys.sched(queue, "lock"), token)


def _hold(r: redis.Redis, queue: str, mark: bool) -> str | None:
    """The queue's dispatcher lock (its token), or None when another holds it; with ``mark``
    the holder is asked to look at the room once more (and the lock is tried again, in case
    the holder left between the two)."""
    token = uuid.uuid4().hex
    lock, again = keys.sched(queue, "lock"), keys.sched(queue, "again")
    if r.set(lock, token, nx=True, px=LOCK_MS):
        return token
    if not mark:
        return None
    r.set(again, 1, px=LOCK_MS)
    if r.set(lock, token, nx=True, px=LOCK_MS):  # the holder left meanwhile: the mark is ours to act on
        r.delete(again)
        return token
    return None


def _fill_room(app, r: redis.Redis, queue: str, out: int) -> int:
    room = window(r, queue) - out
    return _fill(app, r, queue, room) if room > 0 else 0


def _fill(app, r: redis.Redis, queue: str, room: int) -> int:
    tenants = Tenants.from_env()
    candidates = _candidates(r, queue, tenants, room)
    if not candidates:
        return 0
    vts = {k.decode(): float(v) for k, v in r.hgetall(keys.sched(queue, "vt")).items()}
    used = pricing.recent_use(r, queue) if tenants.max_share else {}
    tpm = pricing.queue_tpm(r, queue, [c.job_id for c in candidates]) if tenants.max_share else 0
    # newcomers start level with the least virtual time of those active: no credit for idle time
    floor_t = min((vts[c.tenant] for c in candidates if c.tenant in vts), default=0.0)
    for c in candidates:
        vts.setdefault(c.tenant, floor_t)
    tenant_jobs: dict[str, list[_Candidate]] = {}
    for c in candidates:
        tenant_jobs.setdefault(c.tenant, []).append(c)
    for jobs in tenant_jobs.values():
        floor_j = min((vts[f"job:{c.job_id}"] for c in jobs if f"job:{c.job_id}" in vts), default=0.0)
        for c in jobs:
            vts.setdefault(f"job:{c.job_id}", floor_j)
    costs: dict[str, float] = {}
    picks: list[tuple[_Candidate, list, float]] = []
    while len(picks) < room:
        ready = [c for c in candidates if c.taken < len(c.pending)]
        if not ready:
            break
        best_rank = min(c.rank for c in ready)
        ready = [c for c in ready if c.rank == best_rank]
        open_tenants = sorted({c.tenant for c in ready}, key=lambda t: (vts[t], t))
        chosen = None
        for tenant in open_tenants:
            job = min((c for c in ready if c.tenant == tenant), key=lambda c: (vts[f"job:{c.job_id}"], c.job_id))
            desc = job.pending[job.taken]
            cost = pricing.chunk_cost(r, job.job_id, desc, costs)
            cap = tenants.max_share.get(tenant)
            if cap is not None and tpm and used.get(tenant, 0.0) + cost > cap * tpm:
                continue  # this tenant has had its share of the queue's tokens this minute
            chosen = (tenant, job, desc, cost)
            break
        if chosen is None:
            break
        tenant, job, desc, cost = chosen
        vts[tenant] += cost / tenants.weight(tenant)
        vts[f"job:{job.job_id}"] += cost / job.weight
        used[tenant] = used.get(tenant, 0.0) + cost
        job.taken += 1
        picks.append((job, desc, cost))
    if not picks:
        return 0
    _send(app, r, queue, picks)
    pipe = r.pipeline(transaction=False)
    pipe.hset(keys.sched(queue, "vt"), mapping={k: v for k, v in vts.items()
                                       if not k.startswith("job:") or any(k == f"job:{c.job_id}" for c in candidates)})
    for c in candidates:
        if c.taken:
            pipe.ltrim(keys.pending(c.job_id, queue), c.taken, -1)
    now = time.time()
    for job, _, cost in picks:
        pipe.zadd(keys.sched(queue, "log"), {f"{job.job_id}|{job.tenant}|{cost:.1f}|{uuid.uuid4().hex[:8]}": now})
    pipe.zremrangebyscore(keys.sched(queue, "log"), "-inf", now - SHARE_WINDOW)
    pipe.incrby(keys.sched(queue, "out"), len(picks))
    pipe.execute()
    for c in candidates:
        if c.taken == len(c.pending) and not r.llen(keys.pending(c.job_id, queue)):
            _leave(r, queue, c.job_id)
    return len(picks)


def _candidates(r: redis.Redis, queue: str, tenants: Tenants, room: int) -> list[_Candidate]:
    ids = sorted(j.decode() for j in r.smembers(keys.sched(queue, "jobs")))
    if not ids:
        return []
    held = holding.held(r, queue)
    ids = [j for j in ids if j not in held]
    if not ids:
        return []
    pipe = r.pipeline(transaction=False)
    for job_id in ids:
        pipe.get(keys.status(job_id))
        pipe.lrange(keys.pending(job_id, queue), 0, room - 1)
    replies = pipe.execute()
    out = []
    for n, job_id in enumerate(ids):
        status, pending = (replies[2 * n] or b"").decode(), replies[2 * n + 1]
        if not status or status in FINAL or not pending:
            if not status or status in FINAL:
                r.delete(keys.pending(job_id, queue))
            if not r.llen(keys.pending(job_id, queue)):
                _leave(r, queue, job_id)
            continue
        try:
            sched = stored_job(r, job_id).scheduling
        except LookupError:
            continue
        out.append(_Candidate(job_id, PRIORITIES.index(sched.get("priority", "normal")),
                              sched.get("tenant", "default"), float(sched.get("weight", 1.0)),
                              [json.loads(p) for p in pending]))
    return out


def release_holds(app, r: redis.Redis) -> int:
    """Refill every queue a hold on which has lapsed (``evalq.orchestrator.holding``); how many chunks were sent."""
    queues = holding.due_queues(r)
    return send_now(app, r, queues) if queues else 0


def _leave(r: redis.Redis, queue: str, job_id: str) -> None:
    """A job with nothing more in line on the queue leaves it, and so does its virtual time."""
    r.srem(keys.sched(queue, "jobs"), job_id)
    r.hdel(keys.sched(queue, "vt"), f"job:{job_id}")


def _send(app, r: redis.Redis, queue: str, picks: list) -> None:
    with app.producer_or_acquire() as producer:
        with producer.batch(max_size=2 * len(picks)):
            for job, (metric_key, start, stop, deployment), _ in picks:
                app.send_task("evalq.score_chunk", args=(job.job_id, metric_key, start, stop),
                              kwargs={"deployment": deployment} if deployment else {},
                              queue=queue, producer=producer, ignore_result=True)


def _backlog(r: redis.Redis, queue: str) -> int:
    """Chunks planned and not finished on the queue (in line + out), kept in
    ``evalq:backlog:<queue>`` for ``evalq status`` and autoscaling."""
    ids = [j.decode() for j in r.smembers(keys.sched(queue, "jobs"))]
    pipe = r.pipeline(transaction=False)
    for job_id in ids:
        pipe.llen(keys.pending(job_id, queue))
    total = sum(pipe.execute()) + max(0, int(r.get(keys.sched(queue, "out")) or 0))
    r.set(keys.backlog(queue), total)
    return total


# --- for the sweeper and status --------------------------------------------------------------

def refill_all(app, r: redis.Redis, count_out, only: set[str] | None = None) -> int:
    """The sweeper's pass over every queue with jobs in line (or chunks out): its count of each
    queue's chunks out (``count_out(queues) -> {queue: n}``: queued, reserved, running, read
    from the broker) replaces the running count, which a lost message or a chunk finished
    twice can put off, then the queue is filled. A refill lost with a worker happens here."""
    queues = sorted(q.decode() for q in r.smembers(keys.SCHED_QUEUES) if only is None or q.decode() in only)
    if not queues:
        return 0
    counts = count_out(set(queues))
    sent = 0
    for queue in queues:
        token = _hold(r, queue, mark=False)
        if token is None:
            continue  # a dispatcher is at work on it right now
        try:
            r.set(keys.sched(queue, "out"), counts.get(queue, 0))
            sent += _fill_room(app, r, queue, counts.get(queue, 0))
            if not r.scard(keys.sched(queue, "jobs")) and not counts.get(queue, 0):
                r.srem(keys.SCHED_QUEUES, queue)
            _backlog(r, queue)
        finally:
            leases.release(r, keys.sched(queue, "lock"), token)
    return sent


def shares(r: redis.Redis, queue: str) -> dict[str, float]:
    """Job -> its share of the cost sent on the queue over the last minute."""
    per_job: dict[str, float] = {}
    for member in r.zrangebyscore(keys.sched(queue, "log"), time.time() - SHARE_WINDOW, "+inf"):
        job_id, _, cost, _ = member.decode().split("|")
        per_job[job_id] = per_job.get(job_id, 0.0) + float(cost)
    total = sum(per_job.values())
    return {j: c / total for j, c in per_job.items()} if total else {}


def queued_for(r: redis.Redis, job_id: str, queue: str) -> int:
    return r.llen(keys.pending(job_id, queue))


def send_now(app, r: redis.Redis, queues: set[str]) -> int:
    """Fill every given queue's room (after a stage was put in line, a cancel, a sweep)."""
    sent = 0
    for q in sorted(queues):
        try:
            sent += refill(app, r, q)
        except redis.RedisError:
            raise
        except Exception:  # noqa: BLE001 - one queue's trouble does not stop the others
            log.exception("dispatch: refilling %s failed", q)
    return sent
