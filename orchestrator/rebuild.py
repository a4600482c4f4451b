"""A running job rebuilt from the job store after its Redis lost it (issue 72).

The store holds what decides a job's fate (``evalq.shared.store.ledger``): its document, a marker
while it runs, and a record part per chunk done. Redis holds a cache of it for speed. When Redis
loses a job (flushed, restarted without persistence, a replica promoted before it had the last
writes), the ``evalq.jobs`` workers' sweeper finds the job among the store's markers, puts its
document, status and counts back from the store, marks done every chunk whose part is there, and
sends again exactly the chunks without one (``send_stage`` with ``skip_done``). A chunk's items
already in its part are never scored again; what the loss costs is the calls of the chunks in
flight at it. ``reconcile`` alone serves a job whose Redis is behind the store (a failover that lost
the last seconds of writes): ``evalq resume`` and the sweeper's resume count what the parts say
before they send anything again.

What Redis alone kept starts again after a loss: the judges' budgets and learned capacity (from
the providers' headers, or their floors), the judge cache, and the job's accounting of calls made
before it (results.json's ``judge`` counts only those made after; docs/how-to/cluster.md says so).
"""

from __future__ import annotations

import json
import logging
import time

import redis

from evalq.shared.cluster import keys
from evalq.shared.cluster.spec import (GENERATE_STAGE, METRICS_STAGE, chunk_ids, companions, has_model_stage, span,
                                       stage_runs)
from evalq.shared.cluster.status import FINAL, Status, status_of
from evalq.shared.job.stored import StoredJob, is_stored, store as store_document

log = logging.getLogger("evalq.rebuild")

REBUILT = "rebuilt_at"  # keys.watch: when the job was last rebuilt from the store (what a waiting client reads)
LOCK_SECONDS = 60

# KEYS: the run's recorded hash, its total; ARGV: ttl, then start, count pairs. Each chunk's count as
# its part says, the total their sum (a chunk that finished meanwhile keeps its own count)
_RECOUNT = """
for i = 2, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
local total = 0
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do total = total + tonumber(v) end
redis.call('SET', KEYS[2], total, 'EX', ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('EXPIRE', KEYS[1], ARGV[1]) end
return total
"""


def reconcile(r: redis.Redis, job: StoredJob) -> tuple[int, int]:
    """Count in Redis what the store says is done: each run's records per chunk, and every chunk
    whose part (and its companions' parts) exists as finished. Returns (chunks, items) found done.
    A job outside the store has nothing to reconcile."""
    from evalq.shared.store.ledger import chunks_done

    place = job.place
    if place is None or job.job_id is None:
        return 0, 0
    job_id, ttl, chunks, items = job.job_id, job.ttl, 0, 0
    for stage in (GENERATE_STAGE, METRICS_STAGE):
        runs = stage_runs(job, stage)
        parts = {key: chunks_done(place, key) for key, _ in runs}
        counts = {key: {start: rows for start, (rows, _, _) in found.items()} for key, found in parts.items()}
        done: list[str] = []
        for key, entry in runs:
            if entry.get("led_by"):
                continue  # counted with its leader's chunks
            group = [key, *companions(entry)]
            for start in range(0, span(job, entry), entry["chunk_size"]):
                if all(start in counts.get(k, {}) for k in group):
                    done += chunk_ids(job, key, start)
                    chunks += 1
        pipe = r.pipeline(transaction=False)
        for key, found in counts.items():
            if found:
                args = [v for start, n in sorted(found.items()) for v in (start, n)]
                pipe.eval(_RECOUNT, 2, keys.recorded(job_id, key), keys.recorded_total(job_id, key), ttl, *args)
                items += sum(found.values())
        for key, found in parts.items():  # each chunk's aggregate and time, where Redis has none
            for start, (_, part, seconds) in found.items():
                if part is not None:
                    pipe.hsetnx(keys.parts(job_id, key), str(start), json.dumps(part))
                if seconds is not None:
                    pipe.hsetnx(keys.timings(job_id, key), str(start), repr(seconds))
            for name in (keys.parts(job_id, key), keys.timings(job_id, key)):
                pipe.expire(name, ttl)
        if done:
            pipe.sadd(keys.chunks_done(job_id, stage), *done)
            pipe.expire(keys.chunks_done(job_id, stage), ttl)
        pipe.execute()
    return chunks, items


def rebuild(r: redis.Redis, broker_url: str, job_id: str, place, digest: str | None = None) -> str | None:
    """Put job ``job_id`` back into Redis from its folder in the store and send again what it had
    not done; a sentence for the log, or None where there was nothing to rebuild (its document
    is gone, it is in Redis again, or it is older than the retention and only its marker was left).
    ``digest``: its marker's digest of the document (ValueError where the document was changed)."""
    from evalq.orchestrator.app import client_app
    from evalq.orchestrator.stages import fire_callback, send_stage, stage_complete
    from evalq.shared.store import ledger

    doc = ledger.document(place, digest)
    if doc is None:
        return None
    job = StoredJob(doc, job_id)
    if job.submitted_epoch is not None and time.time() - job.submitted_epoch > job.ttl:
        if job.running:  # its keys would have expired by now: a marker its end failed to remove
            ledger.ended(job.running, job_id)
        return None
    if not r.set(keys.rebuild_lock(job_id), "1", nx=True, ex=LOCK_SECONDS):
        return None  # another jobs worker rebuilds it now
    if is_stored(r, job_id):
        return None
    cancelled = ledger.was_cancelled(place)
    pipe = r.pipeline(transaction=True)
    store_document(pipe, job_id, doc, job.ttl)
    if cancelled:
        pipe.set(keys.status(job_id), Status.CANCELLED, ex=job.ttl)
    else:
        pipe.set(keys.status(job_id), Status.RUNNING, ex=job.ttl, nx=True)
    pipe.zadd(keys.JOBS, {job_id: job.submitted_epoch or time.time()})
    if job.message_id is not None:  # a queue request's: its id is bound to this job again, not to a new one
        idem = keys.request_binding(job.namespace, job.request_id, job.message_id)
        pipe.set(idem, job_id, nx=True, ex=job.ttl)
        pipe.set(f"{idem}:owner", job.message_id, nx=True, ex=job.ttl)
        if job.request_fingerprint is not None:
            pipe.set(f"{idem}:fingerprint", job.request_fingerprint, nx=True, ex=job.ttl)
    pipe.hset(keys.watch(job_id), REBUILT, repr(time.time()))
    pipe.hincrby(keys.watch(job_id), "rebuilds", 1)
    pipe.expire(keys.watch(job_id), job.ttl)
    pipe.execute()
    chunks, items = reconcile(r, job)
    app = client_app(broker_url)
    if cancelled:  # cancelled before the loss: nothing more is scored, its outputs are written
        fire_callback(app, r, job_id, METRICS_STAGE, force=True)
        return (f"job {job_id}: Redis had lost it; rebuilt from the job store, cancelled as it was ({chunks} "
                f"chunks, {items} items done there); its outputs are being written")
    stage = METRICS_STAGE
    if has_model_stage(job) and status_of(r, job_id) not in (Status.GENERATED, *FINAL):
        stage = GENERATE_STAGE  # complete already: its callback summarizes it and sends the metrics
    sent = send_stage(app, r, job_id, job, stage, skip_done=True)
    complete = stage_complete(r, job_id, stage)
    return (f"job {job_id}: Redis had lost it; rebuilt from the job store ({chunks} chunks, {items} items done "
            f"there; {sent} chunks sent again{'; its stage is complete' if complete else ''})")


def rebuild_lost(r: redis.Redis, broker_url: str) -> list[str]:
    """Every job the store says runs that Redis has lost, rebuilt (``EVALQ_STORE`` unset: none)."""
    from evalq.shared.store.ledger import running_jobs
    from evalq.shared.store.place import StoreUnavailable, store_root

    root = store_root()
    if root is None:
        return []
    actions = []
    try:
        for job_id, place, digest in running_jobs(root, wanted=lambda job_id: not is_stored(r, job_id)):
            try:
                done = rebuild(r, broker_url, job_id, place, digest)
            except (StoreUnavailable, ValueError) as exc:  # a store away, or a document changed in a tenant's folder
                log.error("job %s: not rebuilt from the job store: %s", job_id, exc)
                continue
            if done:
                log.warning("%s", done)
                actions.append(done)
    except StoreUnavailable as exc:
        log.error("the job store's running jobs could not be listed: %s", exc)
    return actions
