"""The worker's one task, ``evalq.score_chunk``: a chunk of items of one metric entry,
scored by the chunk runner (``evalq.workers.chunk``); when it is done, the orchestrator's
completion entry point (``evalq.orchestrator.stages.chunk_finished``) counts it."""

from __future__ import annotations

import logging

from celery.signals import worker_init, worker_process_init, worker_process_shutdown, worker_ready, worker_shutdown

from evalq.orchestrator.app import app, app_redis
from evalq.orchestrator import holding
from evalq.orchestrator.parking import park
from evalq.orchestrator.stages import chunk_finished, slot_freed
from evalq.shared.core.errors import Deferred
from evalq.shared.cluster import journal, telemetry
from evalq.shared.cluster.spec import is_model_run
from evalq.shared.cluster.status import Status, status_of
from evalq.workers import chunk, cores, keeping, prefetch, preload

log = logging.getLogger("evalq.worker")
# A countdown is held by the worker that reserved the message; past the
# visibility timeout Redis would hand it to a second worker. Long waits are
# therefore taken in steps well below it.
MAX_COUNTDOWN = 60.0
EARLY = 1.0  # seconds a deferred task comes back before its wait is over

MAX_BLIPS = 5  # Redis errors a task rides out (retried with backoff) before it fails


@app.task(name="evalq.score_chunk", bind=True, ignore_result=True)
def score_chunk(self, job_id: str, metric_key: str, start: int, stop: int,
                deployment: str | None = None, blips: int = 0) -> dict:
    # Retries are counted by hand: a judge chunk may be deferred any number of
    # times, and those must not use up the retries a Redis blip is allowed.
    r = app_redis(self.app)
    queue = self.request.delivery_info.get("routing_key")  # the queue whose window it was sent in
    if status_of(r, job_id) in (Status.CANCELLED, ""):
        # a cancelled job (or one whose keys are gone): drop the chunk unrun, no judge is called
        log.info("job %s %s[%d:%d] dropped: the job is cancelled or gone", job_id, metric_key, start, stop)
        slot_freed(self.app, r, queue)
        return {"metric": metric_key, "start": start, "n": 0, "dropped": True}
    journal.begin(job_id, journal.chunk_id(metric_key, start), n=stop - start, task=self.request.id,
                  worker=self.request.hostname)
    try:
        with cores.scoring():
            out = chunk.run_chunk(r, job_id, metric_key, start, stop, deployment, queue=queue)
    except Deferred as exc:
        region = exc.region or deployment
        kind = "generate" if is_model_run(metric_key) else "judge"
        if exc.own and queue:  # the job's or its tenant's own limit: its slot goes to the others meanwhile
            log.info("job %s %s[%d:%d] held off for %.1f s, its slot given up: %s", job_id, metric_key, start, stop,
                     exc.wait, exc)
            holding.put_back(r, job_id, [metric_key, start, stop, region], f"{kind}.{region}" if region else queue,
                             exc.wait)
            slot_freed(self.app, r, queue)
            return {"metric": metric_key, "start": start, "n": 0, "held": round(exc.wait, 3)}
        vt = self.app.conf.broker_transport_options.get("visibility_timeout", 3600)
        # Back a little early: the last stretch is slept in the worker, which
        # wakes on time, where a Celery countdown can run late.
        countdown = max(0.05, min(exc.wait - EARLY, MAX_COUNTDOWN, vt / 4))
        log.info("job %s %s[%d:%d] deferred %.1f s: %s", job_id, metric_key, start, stop, countdown, exc)
        # Same task id: the chunk is still the same one of its stage.
        raise self.retry(args=(job_id, metric_key, start, stop), kwargs={"deployment": region, "blips": blips},
                         queue=f"{kind}.{region}" if region else self.request.delivery_info.get("routing_key"),
                         countdown=countdown, max_retries=self.request.retries + 1)
    except chunk.Parked as exc:  # its items wait for provider batches: woken when their replies are back
        log.info("job %s %s[%d:%d] parked: %s", job_id, metric_key, start, stop, exc)
        park(self.app, r, job_id, metric_key, start, stop, deployment, queue, exc.digests)
        return {"metric": metric_key, "start": start, "n": 0, "parked": len(exc.digests)}
    except chunk.REDIS_BLIPS as exc:
        if blips >= MAX_BLIPS:
            log.error("job %s %s[%d:%d] failed after %d Redis (or job store) errors", job_id, metric_key, start,
                      stop, blips)
            chunk_finished(self.app, r, job_id, metric_key, start, queue)
            raise
        raise self.retry(exc=exc, args=(job_id, metric_key, start, stop),
                         kwargs={"deployment": deployment, "blips": blips + 1},
                         countdown=min(60, 2 ** blips), max_retries=self.request.retries + 1)
    except Exception:
        # Not an item's failure (those are recorded on the item): the chunk is
        # given up, its items stay without records (``n_missing``, "no result
        # recorded"), and the stage still completes.
        log.exception("job %s %s[%d:%d] failed", job_id, metric_key, start, stop)
        chunk_finished(self.app, r, job_id, metric_key, start, queue)
        raise
    chunk_finished(self.app, r, job_id, metric_key, start, queue)
    journal.note("done", job_id, journal.chunk_id(metric_key, start))
    return out


_managers: list = []


@worker_ready.connect
def start_batch_manager(sender, **_) -> None:
    """A worker of ``judge.<region>`` or ``generate.<region>`` queues also runs the Batch API
    path of those regions (``evalq.workers.judge.batches``): it holds their keys and the
    allow-list. Off with ``EVALQ_BATCH_TICK=0``."""
    queues = sender.app.amqp.queues.consume_from or {}
    regions = {q.split(".", 1)[1] for q in queues if q.startswith(("judge.", "generate."))}
    if not regions:  # a cpu or gpu worker: no judge machinery is imported
        return
    from evalq.workers.judge.batches import BatchManager, BatchTiming

    timing = BatchTiming.from_env()
    if timing.tick <= 0:
        return
    manager = BatchManager(sender.app.conf.broker_url, regions, sender.hostname, timing)
    manager.start()
    _managers.append(manager)


@worker_init.connect
def share_cores(**_) -> None:
    """In a gpu worker of several processes, before its pool forks: the table in which they say
    when they score, so that the CPUs of idle ones go to the busy (``evalq.workers.cores``)."""
    consumed = app.amqp.queues.consume_from or {}
    if any(q.split(".", 1)[0] == "gpu" for q in consumed):
        cores.prepare(prefetch.processes())  # none for a single process


@worker_process_init.connect
def preload_models(**_) -> None:
    """The process that scores (a prefork child, or the solo pool's worker itself) starts loading
    the models ``EVALQ_PRELOAD`` names for its queues before its first chunk arrives."""
    consumed = app.amqp.queues.consume_from or {}
    kinds = {q.split(".", 1)[0] for q in consumed}
    if "gpu" in kinds and not prefetch.alone():
        import os

        log.info("gpu worker process %d: one of %s, each with its own model, %s CPU thread(s) each", os.getpid(),
                 os.environ.get("EVALQ_GPU_PROCESSES"), os.environ.get("OMP_NUM_THREADS", "all"))
    preload.start(kinds)


def write_held(**_) -> None:
    """Item records held while Redis was away get a last chance before the process goes."""
    keeping.WRITE_BEHIND.drain(timeout=10.0)


worker_shutdown.connect(write_held)
worker_process_shutdown.connect(write_held)
# a prefork child that exits takes its live gauges along; its counters stay counted
worker_process_shutdown.connect(telemetry.process_exit)
