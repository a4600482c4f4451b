"""Chunks that wait for provider batches (``judging.mode`` batch or auto, issue #24).

A judge chunk whose items ask calls nobody has answered yet does not hold a worker
slot for hours: its answered items are kept (``evalq.workers.keeping``), its calls
become batch lines, and the chunk is *parked*, ``evalq:{J}:parked`` holding
``<metric key>:<start>`` -> the chunk and the calls (request digests) it waits for.
Its slot goes to the next chunk in line.

A parked chunk is woken, put back in line on its queue (``evalq.orchestrator.dispatch``),
once none of its calls is a waiting batch line any more (each was answered, or goes
synchronously): by the batch manager after it harvested a batch, and by the chunk
itself when the replies came while it was parking. Whoever removes the parked entry
(HDEL answers 1 once) puts it back in line, so a chunk is woken once; run again, it
reads its replies from the job's memo and asks the next round of calls, if any.
"""

from __future__ import annotations

import json
import logging

import redis

from evalq.shared.cluster import keys
from evalq.shared.job.stored import default_retention, stored_job
from evalq.shared.cluster.status import FINAL, status_of

log = logging.getLogger("evalq.parking")


def _retention(r: redis.Redis, job_id: str) -> int:
    """The job's retention from this process's copy of its spec (the worker parking a chunk has read
    it already: no round trip), the cluster's setting where it has none."""
    try:
        return stored_job(r, job_id).ttl
    except LookupError:
        return default_retention()


def park(app, r: redis.Redis, job_id: str, metric_key: str, start: int, stop: int,
         deployment: str | None, queue: str, digests: list[str]) -> None:
    """Park a chunk whose items wait for ``digests``; its slot on ``queue`` is freed."""
    from evalq.orchestrator.stages import slot_freed

    field = f"{metric_key}:{start}"
    entry = {"chunk": [metric_key, start, stop, deployment], "queue": queue, "waits": digests}
    pipe = r.pipeline(transaction=False)
    pipe.hset(keys.parked(job_id), field, json.dumps(entry))
    pipe.expire(keys.parked(job_id), _retention(r, job_id))
    pipe.execute()
    slot_freed(app, r, queue)
    if not waiting(r, job_id, digests):  # answered while its items were being asked
        _wake(app, r, job_id, {field: entry})


def waiting(r: redis.Redis, job_id: str, digests: list[str]) -> set[str]:
    """Which of ``digests`` are still batch lines waiting for a reply."""
    if not digests:
        return set()
    found = r.hmget(keys.batch(job_id, "line"), digests)
    return {d for d, line in zip(digests, found) if line is not None}


def wake(app, r: redis.Redis, job_id: str) -> int:
    """Put back in line every parked chunk of the job that waits for nothing any more;
    how many. A job that ended drops its parked chunks."""
    parked = {k.decode(): json.loads(v) for k, v in r.hgetall(keys.parked(job_id)).items()}
    if not parked:
        return 0
    if status_of(r, job_id) in (*FINAL, ""):
        r.delete(keys.parked(job_id))
        return 0
    still = waiting(r, job_id, sorted({d for p in parked.values() for d in p["waits"]}))
    return _wake(app, r, job_id, {field: p for field, p in parked.items() if not still.intersection(p["waits"])})


def waits_for_batches(r: redis.Redis, job_id: str) -> bool:
    """Whether the job has chunks parked or lines waiting for a batch (it is not idle, only slow)."""
    pipe = r.pipeline(transaction=False)
    pipe.hlen(keys.parked(job_id))
    pipe.hlen(keys.batch(job_id, "line"))
    return any(pipe.execute())


def batch_view(r: redis.Redis, job_id: str) -> dict | None:
    """What ``evalq status`` shows of a job's Batch API path (None when it has none): lines
    waiting for a reply, chunks parked, lines sent synchronously instead, and each batch
    (provider id, region, state, lines answered of sent, failed, expected end, created)."""
    from datetime import datetime, timezone

    def when(t: float | None) -> str | None:
        return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds") if t else None

    pipe = r.pipeline(transaction=False)
    pipe.hlen(keys.batch(job_id, "line"))
    pipe.hlen(keys.parked(job_id))
    pipe.hlen(keys.batch(job_id, "sync"))
    pipe.hvals(keys.batch(job_id, "open"))
    waiting, parked, sync, raw = pipe.execute()
    if not (waiting or parked or sync or raw):
        return None
    batches = []
    for rec in sorted((json.loads(v) for v in raw), key=lambda rec: rec["created"]):
        batches.append({"id": rec["provider"] or rec["id"], "region": rec["region"], "judge": rec["judge"],
                        "state": rec["state"], "lines": rec["lines"], "completed": rec.get("completed", 0),
                        "failed": rec.get("failed", 0), "tokens": rec["tokens"],
                        "created_at": when(rec["created"]), "expected_end": when(rec.get("expected_end")),
                        "ended_at": when(rec.get("ended"))})
    return {"waiting_lines": waiting, "parked_chunks": parked, "sent_sync": sync, "batches": batches}


def _wake(app, r: redis.Redis, job_id: str, ready: dict[str, dict]) -> int:
    """Put the parked chunks ``ready`` (field -> parked entry) back in line on their queues."""
    from evalq.orchestrator import dispatch

    woken, queues = 0, set()
    for field, entry in ready.items():
        if not r.hdel(keys.parked(job_id), field):
            continue  # woken by someone else
        queue = entry["queue"]
        pipe = r.pipeline(transaction=False)
        pipe.rpush(keys.pending(job_id, queue), json.dumps(entry["chunk"]))
        pipe.sadd(keys.sched(queue, "jobs"), job_id)
        pipe.sadd(keys.SCHED_QUEUES, queue)
        pipe.execute()
        woken += 1
        queues.add(queue)
    for queue in queues:
        dispatch.refill(app, r, queue)
    if woken:
        log.info("job %s: %d chunk(s) woken: their batch replies are in", job_id, woken)
    return woken
