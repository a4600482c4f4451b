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
from evalq.shared.config import JOBS_QUEUE, Settings
from evalq.shared.spec import stored_spec
from evalq.shared.status import Status, status_of

log = logging.getLogger("evalq.jobs")

MAX_BLIPS = 5  # Redis errors a callback rides out (retried with backoff) before it fails
redis_task = functools.partial(app.task, bind=True, autoretry_for=(redis.ConnectionError, redis.TimeoutError),
                               retry_backoff=True, max_retries=MAX_BLIPS)


@redis_task(name="evalq.finalize")
def finalize(self, job_id: str) -> dict:
    r = app_redis(self.app)
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
    r = app_redis(self.app)
    out = aggregation.generated(r, job_id)
    spec = stored_spec(r, job_id)
    if status_of(r, job_id) == Status.CANCELLED:
        return aggregation.finalize(r, job_id, status=Status.CANCELLED)
    stages.send_stage(self.app, r, job_id, spec, stages.METRICS_STAGE)
    return out


@app.task(name="evalq.submit_job", bind=True, ignore_result=True)
def submit_job(self, **request) -> dict:
    """A job request (see ``evalq.orchestrator.service``): validate, store, send the first stage."""
    from evalq.orchestrator.service import handle_request

    return handle_request(self.app, app_redis(self.app), self.request.id,
                          self.app.conf.broker_url, **request)


_sweepers: list = []


@worker_init.connect
def cluster_worker(**_) -> None:
    """A worker is the cluster: S3 places and endpoints not listed by the operator are
    refused (``evalq.shared.egress``), in this process and the pool children it forks;
    and a queue message it cannot parse is dropped, not a reason to stop."""
    from evalq.shared.egress import enforce_on_cluster
    from evalq.orchestrator.app import drop_unreadable_messages

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
