"""Thin Celery tasks: a JSON payload in, the runner does the work, a small summary out."""

from __future__ import annotations

import functools
import logging

import redis
from celery.signals import worker_init, worker_process_shutdown, worker_ready, worker_shutdown

from evalq.shared import keys
from evalq.shared.config import JOBS_QUEUE, Settings
from evalq.shared.errors import Deferred
from evalq.shared.model import GENERATE
from evalq.workers import finalize as aggregation
from evalq.workers import keeping, runner, stages
from evalq.workers.app import app

log = logging.getLogger("evalq.worker")
# A countdown is held by the worker that reserved the message; past the
# visibility timeout Redis would hand it to a second worker. Long waits are
# therefore taken in steps well below it.
MAX_COUNTDOWN = 60.0
EARLY = 1.0  # seconds a deferred task comes back before its wait is over

MAX_BLIPS = 5  # Redis errors a task rides out (retried with backoff) before it fails

# The callbacks ride out a Redis blip the same way.
redis_task = functools.partial(app.task, bind=True, autoretry_for=(redis.ConnectionError, redis.TimeoutError),
                               retry_backoff=True, max_retries=MAX_BLIPS)


@app.task(name="evalq.score_chunk", bind=True, ignore_result=True)
def score_chunk(self, job_id: str, metric_key: str, start: int, stop: int,
                deployment: str | None = None, blips: int = 0) -> dict:
    # Retries are counted by hand: a judge chunk may be deferred any number of
    # times, and those must not use up the retries a Redis blip is allowed.
    r = runner.redis_client(self.app)
    if r.get(keys.status(job_id)) in (b"cancelled", None):
        # a cancelled job (or one whose keys are gone): drop the chunk unrun, no judge is called
        log.info("job %s %s[%d:%d] dropped: the job is cancelled or gone", job_id, metric_key, start, stop)
        return {"metric": metric_key, "start": start, "n": 0, "dropped": True}
    try:
        out = runner.run_chunk(r, job_id, metric_key, start, stop, deployment)
    except Deferred as exc:
        vt = self.app.conf.broker_transport_options.get("visibility_timeout", 3600)
        # Back a little early: the last stretch is slept in the worker, which
        # wakes on time, where a Celery countdown can run late.
        countdown = max(0.05, min(exc.wait - EARLY, MAX_COUNTDOWN, vt / 4))
        region = exc.region or deployment
        kind = "generate" if metric_key == GENERATE else "judge"
        log.info("job %s %s[%d:%d] deferred %.1f s: %s", job_id, metric_key, start, stop, countdown, exc)
        # Same task id, same chord membership.
        raise self.retry(args=(job_id, metric_key, start, stop), kwargs={"deployment": region, "blips": blips},
                         queue=f"{kind}.{region}" if region else self.request.delivery_info.get("routing_key"),
                         countdown=countdown, max_retries=self.request.retries + 1)
    except runner.REDIS_BLIPS as exc:
        if blips >= MAX_BLIPS:
            log.error("job %s %s[%d:%d] failed after %d Redis errors", job_id, metric_key, start, stop, blips)
            stages.chunk_finished(self.app, r, job_id, metric_key, start)
            raise
        raise self.retry(exc=exc, args=(job_id, metric_key, start, stop),
                         kwargs={"deployment": deployment, "blips": blips + 1},
                         countdown=min(60, 2 ** blips), max_retries=self.request.retries + 1)
    except Exception:
        # Not an item's failure (those are recorded on the item): the chunk is
        # given up, its items stay without records (``n_missing``, "no result
        # recorded"), and the stage still completes.
        log.exception("job %s %s[%d:%d] failed", job_id, metric_key, start, stop)
        stages.chunk_finished(self.app, r, job_id, metric_key, start)
        raise
    stages.chunk_finished(self.app, r, job_id, metric_key, start)
    return out


@redis_task(name="evalq.finalize")
def finalize(self, job_id: str) -> dict:
    r = runner.redis_client(self.app)
    try:
        return aggregation.finalize(r, job_id)
    except (redis.ConnectionError, redis.TimeoutError):
        raise  # retried
    except Exception as exc:  # a job must end: failed, saying why, rather than running for ever
        log.exception("job %s: the final callback failed", job_id)
        return aggregation.fail(r, job_id, f"the final callback failed: {type(exc).__name__}: {exc}")


@redis_task(name="evalq.generated")
def generated(self, job_id: str) -> dict:
    """The generation stage is complete: summarize it, then send the metrics stage."""
    r = runner.redis_client(self.app)
    out = aggregation.generated(r, job_id)
    spec = runner.job_spec(r, job_id)
    if r.get(keys.status(job_id)) == b"cancelled":
        return aggregation.finalize(r, job_id, status="cancelled")
    stages.send_stage(self.app, r, job_id, spec, stages.METRICS_STAGE)
    return out


@app.task(name="evalq.submit_job", bind=True, ignore_result=True)
def submit_job(self, **request) -> dict:
    """A job request (see ``evalq.orchestrator.service``): validate, store, send the first stage."""
    from evalq.orchestrator.service import handle_request

    return handle_request(self.app, runner.redis_client(self.app), self.request.id,
                          self.app.conf.broker_url, **request)


_sweepers: list = []


@worker_init.connect
def cluster_worker(**_) -> None:
    """A worker is the cluster: S3 places and endpoints not listed by the operator are
    refused (``evalq.shared.egress``), in this process and the pool children it forks;
    and a queue message it cannot parse is dropped, not a reason to stop."""
    from evalq.shared.egress import enforce_on_cluster
    from evalq.workers.app import drop_unreadable_messages

    enforce_on_cluster()
    drop_unreadable_messages()


@worker_ready.connect
def start_sweeper(sender, **_) -> None:
    """A worker of the evalq.jobs queue (the orchestrator role) also looks after the
    cluster's running jobs, so a lost message never strands one whose submitter is
    gone (``evalq.orchestrator.watch``). Off with ``EVALQ_SWEEP_INTERVAL=0``."""
    interval = Settings.from_env().sweep_interval
    if interval <= 0 or JOBS_QUEUE not in (sender.app.amqp.queues.consume_from or {}):
        return
    from evalq.orchestrator.watch import Sweeper

    sweeper = Sweeper(sender.app.conf.broker_url, interval, name=sender.hostname)
    sweeper.start()
    _sweepers.append(sweeper)


@worker_shutdown.connect
def stop_sweeper(**_) -> None:
    for sweeper in _sweepers:
        sweeper.stop()


def write_held(**_) -> None:
    """Item records held while Redis was away get a last chance before the process goes."""
    keeping.WRITE_BEHIND.drain(timeout=10.0)


worker_shutdown.connect(write_held)
worker_process_shutdown.connect(write_held)
