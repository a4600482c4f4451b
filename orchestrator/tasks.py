"""The orchestrator's Celery tasks, run by the ``evalq.jobs`` role (and embedded workers):
``evalq.submit_job`` (a request: validate, store, send the first stage), ``evalq.generated``
(the generation stage's callback: send the metrics stage) and ``evalq.finalize`` (the final
callback: aggregate, write the outputs, answer ``reply_to``); and the sweeper the jobs role
runs beside them. Thin: each calls the module that does the work."""

from __future__ import annotations

import functools
import logging

import redis
from celery.signals import worker_init, worker_ready, worker_shutdown

from evalq.orchestrator import finalize as aggregation
from evalq.orchestrator import stages
from evalq.orchestrator.app import app, app_redis
from evalq.shared.core.config import JOBS_QUEUE, Settings
from evalq.shared.job.stored import stored_job
from evalq.shared.cluster.status import Status, status_of

log = logging.getLogger("evalq.jobs")

MAX_BLIPS = 5  # Redis errors a callback rides out (retried with backoff) before it fails
redis_task = functools.partial(app.task, bind=True, autoretry_for=(redis.ConnectionError, redis.TimeoutError),
                               retry_backoff=True, max_retries=MAX_BLIPS)


def run_once(task, job_id: str, stage: str, work) -> dict:
    """Run a stage callback's ``work(r)`` under the stage's lease: a copy that finds another
    running ends at once (two never write a job's outputs side by side), and one that comes
    after the job ended (done, or failed) does nothing: its outputs are written already."""
    r = app_redis(task.app)
    lease = stages.callback_lease(r, job_id, stage, owner=task.request.hostname or "")
    if not lease.acquire():
        log.info("job %s: the %s stage's callback is running elsewhere; this copy ends", job_id, stage)
        return {"job": job_id, "status": "running elsewhere"}
    with lease:
        status = status_of(r, job_id)
        if status in (Status.DONE, Status.FAILED):
            log.info("job %s: has ended (%s); this copy of its %s callback ends", job_id, status, stage)
            return {"job": job_id, "status": status}
        return work(r)


@redis_task(name="evalq.finalize")
def finalize(self, job_id: str) -> dict:
    def work(r: redis.Redis) -> dict:
        try:
            return aggregation.finalize(r, job_id)
        except (redis.ConnectionError, redis.TimeoutError):
            raise  # retried
        except Exception as exc:  # a job must end: failed, saying why, rather than running for ever
            log.exception("job %s: the final callback failed", job_id)
            return aggregation.fail(r, job_id, f"the final callback failed: {type(exc).__name__}: {exc}")

    return run_once(self, job_id, stages.METRICS_STAGE, work)


@redis_task(name="evalq.generated")
def generated(self, job_id: str) -> dict:
    """The generation stage is complete: summarize it, then send the metrics stage."""
    def work(r: redis.Redis) -> dict:
        out = aggregation.generated(r, job_id)
        spec = stored_job(r, job_id)
        if status_of(r, job_id) == Status.CANCELLED:
            return aggregation.finalize(r, job_id, status=Status.CANCELLED)
        stages.send_stage(self.app, r, job_id, spec, stages.METRICS_STAGE)
        return out

    return run_once(self, job_id, stages.GENERATE_STAGE, work)


@app.task(name="evalq.submit_job", bind=True, ignore_result=True)
def submit_job(self, **request) -> dict:
    """A job request (see ``evalq.orchestrator.service``): validate, store, send the first stage."""
    from evalq.orchestrator.app import consumed_queue
    from evalq.orchestrator.service import handle_request

    # the queue it was really taken from says whose it is: evalq.jobs.<tenant>, which only that
    # tenant may write (the transport's knowledge, never what the message says of itself)
    queue = consumed_queue(self.request)
    return handle_request(self.app, app_redis(self.app), self.request.id,
                          self.app.conf.broker_url, queue=queue, **request)


_sweepers: list = []
_beats: list = []  # the slot announcers' stop events


@worker_init.connect
def cluster_worker(**_) -> None:
    """A worker is the cluster: S3 places and endpoints not listed by the operator are
    refused (``evalq.shared.policy.egress``), in this process and the pool children it forks;
    a queue message it cannot parse is dropped, not a reason to stop; and every message
    says the queue it was really taken from (``stamp_consumed_queue``), not its sender's claim."""
    from evalq.shared.policy.egress import enforce_on_cluster
    from evalq.orchestrator.app import drop_unreadable_messages, stamp_consumed_queue
    from evalq.orchestrator.service import answer_refused

    enforce_on_cluster()
    drop_unreadable_messages()
    stamp_consumed_queue(on_refused=answer_refused)


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


@worker_ready.connect
def serve_backlog(sender, **_) -> None:
    """A worker of the evalq.jobs queue serves each queue's backlog over HTTP for autoscaling
    (``evalq.orchestrator.backlog``) on ``EVALQ_BACKLOG_HOST`` (127.0.0.1) and
    ``EVALQ_BACKLOG_PORT`` (9808; 0: off). A port already taken is logged, not fatal."""
    import os

    from evalq.shared.core.config import env_number

    port = env_number("EVALQ_BACKLOG_PORT", 9808)
    if not port or JOBS_QUEUE not in (sender.app.amqp.queues.consume_from or {}):
        return
    from evalq.orchestrator.backlog import BacklogServer

    try:
        server = BacklogServer(app_redis(sender.app), os.environ.get("EVALQ_BACKLOG_HOST", "127.0.0.1"), port)
    except OSError as exc:
        log.warning("backlog: not served on port %d: %s", port, exc)
        return
    server.start()


@worker_ready.connect
def announce_slots(sender, **_) -> None:
    """Every worker says, every few seconds, how many chunks it runs at once on each queue it
    consumes: a queue's window is sized from them (``evalq.orchestrator.dispatch``)."""
    import threading

    from evalq.orchestrator import dispatch
    from evalq.shared.core.config import CONTROL_QUEUE, is_request_queue

    queues = [q for q in (sender.app.amqp.queues.consume_from or {}) if q != CONTROL_QUEUE and not is_request_queue(q)]
    slots = int(getattr(getattr(sender, "controller", None), "concurrency", 0) or 1)
    if not queues:
        return
    stopped = threading.Event()
    _beats.append(stopped)  # set at shutdown

    def beat() -> None:
        r = app_redis(sender.app)
        while True:
            try:
                dispatch.announce(r, sender.hostname, queues, slots)
                if not stopped.is_set():  # a fresh worker may be what a queue waited for
                    dispatch.send_now(sender.app, r, set(queues))
            except Exception as exc:  # noqa: BLE001 - Redis away: the next beat tries again
                log.info("slots: could not announce (%s)", exc)
            if stopped.wait(dispatch.SLOTS_TTL / 3):
                return

    threading.Thread(target=beat, name="evalq-slots", daemon=True).start()


@worker_shutdown.connect
def stop_sweeper(**_) -> None:
    for sweeper in _sweepers:
        sweeper.stop()
    for beat in _beats:
        beat.set()
