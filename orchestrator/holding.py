"""Jobs held off a queue while their own limit is spent (issue 70).

A chunk whose calls wait for the job's or its tenant's own limit (its share of a deployment, its
own lower TPM, its caps: ``Deferred.own``) gives its slot on the queue to the other jobs rather
than keeping it while it waits: it goes back to the end of its job's line on the queue, and the
job is held off the queue until its wait is over; the dispatcher (``evalq.orchestrator.dispatch``)
passes held jobs by, and the sweeper refills a queue when a hold on it lapses (``due_queues``). A
tenant within its share thus never keeps the slots of a shared deployment's queue while its own
share is spent; the deployment's own waits (its TPM spent for everyone, a 429's pause) still keep
their slot, since every job waits for those alike.

Keys: ``evalq:sched:{Q}:hold`` HASH job -> when it may be sent again (seconds since the epoch);
``evalq:sched:holds`` ZSET ``<queue>|<job>`` -> the same, for the sweeper's wake-ups.
"""

from __future__ import annotations

import json
import time

import redis

from evalq.shared.cluster import keys


def put_back(r: redis.Redis, job_id: str, chunk: list, queue: str, seconds: float) -> None:
    """Put ``chunk`` (its descriptor: metric key, start, stop, deployment) back at the end of the
    job's line on ``queue`` and hold the job off it for ``seconds``. The caller frees the slot the
    chunk had (``evalq.orchestrator.stages.slot_freed``). At the end, as a woken parked chunk goes:
    a dispatcher reads a line's head, sends, then trims as many from the head, so a descriptor pushed
    at the head meanwhile would be trimmed unsent and another sent twice."""
    until = time.time() + max(0.0, seconds)
    pipe = r.pipeline(transaction=False)
    pipe.rpush(keys.pending(job_id, queue), json.dumps(chunk))
    pipe.sadd(keys.sched(queue, "jobs"), job_id)
    pipe.sadd(keys.SCHED_QUEUES, queue)
    pipe.hset(keys.sched(queue, "hold"), job_id, f"{until:.3f}")
    pipe.expire(keys.sched(queue, "hold"), int(seconds) + 3600)
    pipe.zadd(keys.SCHED_HOLDS, {f"{queue}|{job_id}": until})
    pipe.execute()


def held(r: redis.Redis, queue: str) -> set[str]:
    """The jobs held off ``queue`` now (lapsed holds are forgotten)."""
    raw = r.hgetall(keys.sched(queue, "hold"))
    if not raw:
        return set()
    now, found, lapsed = time.time(), set(), []
    for job, until in raw.items():
        if float(until) > now:
            found.add(job.decode())
        else:
            lapsed.append(job)
    if lapsed:
        r.hdel(keys.sched(queue, "hold"), *lapsed)
    return found


def next_due(r: redis.Redis) -> float | None:
    """Seconds until the next hold lapses (0 when one has), or None when no job is held."""
    first = r.zrange(keys.SCHED_HOLDS, 0, 0, withscores=True)
    return max(0.0, first[0][1] - time.time()) if first else None


def due_queues(r: redis.Redis) -> set[str]:
    """The queues on which a hold has lapsed since the last look (each told once)."""
    queues = set()
    for member in r.zrangebyscore(keys.SCHED_HOLDS, "-inf", time.time()):
        if r.zrem(keys.SCHED_HOLDS, member):  # one looker-after per lapsed hold
            queues.add(member.decode().rsplit("|", 1)[0])
    return queues
