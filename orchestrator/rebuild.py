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

What a judge chunk's calls counted rides in its part (``evalq.workers.keeping``), so the entry's
accounting and the job's cost and token counters are put back no lower than the parts say (a cap is
never reset; the calls of chunks in flight at the loss may go uncounted). A queue request's job is
found by the request too (``rebound``): a request that comes again before the sweeper's rebuild is
answered with its job, rebuilt then, never made a second job. A tenant's daily spend is kept in the
store by ``evalq.orchestrator.spend``. What Redis alone kept starts again after a loss: the judges'
budgets and learned capacity (from the providers' headers, or their floors), the judge cache, and
Batch API lines' counts (docs/how-to/cluster.md says so).
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


# KEYS: an entry's accounting hash; ARGV: ttl, then field, value pairs: each field no lower than the parts
# say (the calls of chunks in flight at the loss may have counted a little there since)
_ACCOUNT = """
for i = 2, #ARGV, 2 do
  if tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0') < tonumber(ARGV[i + 1]) then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
"""
# KEYS: a spend counter; ARGV: what the store says was spent, the counter's ttl (0: none)
_AT_LEAST = """
local now = tonumber(redis.call('GET', KEYS[1]) or '0')
if now < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1], 'KEEPTTL')
  if redis.call('TTL', KEYS[1]) < 0 and tonumber(ARGV[2]) > 0 then redis.call('EXPIRE', KEYS[1], ARGV[2]) end
end
"""


def reconcile(r: redis.Redis, job: StoredJob) -> tuple[int, int]:
    """Count in Redis what the store says is done: each run's records per chunk, and every chunk
    whose part (and its companions' parts) exists as finished. Returns (chunks, items) found done.
    A job outside the store has nothing to reconcile."""
    from evalq.shared.store.ledger import chunks_done
    from evalq.shared.store.records import summed

    place = job.place
    if place is None or job.job_id is None:
        return 0, 0
    job_id, ttl, chunks, items = job.job_id, job.ttl, 0, 0
    spent: dict[str, int] = {}
    for stage in (GENERATE_STAGE, METRICS_STAGE):
        runs = stage_runs(job, stage)
        parts = {key: chunks_done(place, key) for key, _ in runs}
        counts = {key: {start: done.rows for start, done in found.items()} for key, found in parts.items()}
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
            for start, landed in found.items():
                if landed.part is not None:
                    pipe.hsetnx(keys.parts(job_id, key), str(start), json.dumps(landed.part))
                if landed.seconds is not None:
                    pipe.hsetnx(keys.timings(job_id, key), str(start), repr(landed.seconds))
                if landed.compute is not None:
                    pipe.hsetnx(keys.timings(job_id, key), f"{keys.COMPUTE}{start}", repr(landed.compute))
            for name in (keys.parts(job_id, key), keys.timings(job_id, key)):
                pipe.expire(name, ttl)
            accounted = summed(landed.counts for landed in found.values())
            if accounted:  # the entry's accounting (results.json's judge counts), where Redis lost it
                pipe.eval(_ACCOUNT, 1, keys.accounting(job_id, key), ttl, *[v for kv in accounted.items() for v in kv])
                spent["cost_nano"] = spent.get("cost_nano", 0) + accounted.get("cost_nano", 0)
                spent["reserved_tokens"] = spent.get("reserved_tokens", 0) + accounted.get("reserved_tokens", 0)
        if done:
            pipe.sadd(keys.chunks_done(job_id, stage), *done)
            pipe.expire(keys.chunks_done(job_id, stage), ttl)
        pipe.execute()
    # the job's own caps count from what its landed calls spent, never from nothing
    for counter, amount in ((keys.job_cost(job_id), spent.get("cost_nano")),
                            (keys.job_tokens(job_id), spent.get("reserved_tokens"))):
        if amount:
            at_least(r, counter, amount, ttl)
    return chunks, items


def at_least(r: redis.Redis, counter: str, amount: int, ttl: int) -> None:
    """A spend counter no lower than ``amount`` (what the store says was spent): a Redis that lost it
    starts from there, one that has more keeps it."""
    r.eval(_AT_LEAST, 1, counter, int(amount), int(ttl))


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
            ledger.ended(job.running, job_id, job.binding)
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
    if job.binding is not None:  # a queue request's: its id is bound to this job again, not to a new one
        bind(pipe, job, nx=True)
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
            f"there; {sent} chunks sent again{'; its stage is complete' if complete else ''}); its judges' budgets "
            "and learned capacity start again from the providers' headers (or their floors)")


def bind(pipe, job: StoredJob, nx: bool) -> None:
    """Bind the job's queue request to it (``nx``: unless the request is bound already)."""
    pipe.set(job.binding, job.job_id, nx=nx, ex=job.ttl)
    pipe.set(f"{job.binding}:owner", job.message_id, nx=nx, ex=job.ttl)
    if job.request_fingerprint is not None:
        pipe.set(f"{job.binding}:fingerprint", job.request_fingerprint, nx=nx, ex=job.ttl)


def rebound(r: redis.Redis, broker_url: str, binding: str) -> StoredJob | None:
    """The running job the store says a queue request made, where Redis has lost it (its request was
    redelivered, or sent again, between the loss and the sweeper's rebuild): bound to the request
    again and rebuilt now, so the request never makes a second job. None where the store knows no
    running job of the request (``EVALQ_STORE`` unset: none)."""
    from evalq.shared.store.ledger import document, requested
    from evalq.shared.store.place import StoreUnavailable, store_root

    root = store_root()
    if root is None:
        return None
    try:
        found = requested(root, binding)
        if found is None:
            return None
        job_id, place, digest = found
        doc = document(place, digest)
    except (StoreUnavailable, ValueError) as exc:
        log.error("request %s: its job in the job store could not be read: %s", binding, exc)
        return None
    if doc is None:
        return None
    job = StoredJob(doc, job_id)
    pipe = r.pipeline(transaction=True)
    bind(pipe, job, nx=False)  # over the fresh job id the request was just given
    pipe.execute()
    done = rebuild(r, broker_url, job_id, place, digest)  # None: another jobs worker rebuilds it now
    log.warning("request %s: %s", binding, done or f"job {job_id} is being rebuilt from the job store")
    return job


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
