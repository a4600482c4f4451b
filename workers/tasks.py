"""Thin Celery tasks: a JSON payload in, the runner does the work, a small summary out."""

from __future__ import annotations

import functools
import logging

import redis

from evalq.shared.errors import Deferred
from evalq.shared.model import GENERATE
from evalq.workers import finalize as aggregation
from evalq.workers import runner
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


@app.task(name="evalq.score_chunk", bind=True)
def score_chunk(self, job_id: str, metric_key: str, start: int, stop: int,
                deployment: str | None = None, blips: int = 0) -> dict:
    # Retries are counted by hand: a judge chunk may be deferred any number of
    # times, and those must not use up the retries a Redis blip is allowed.
    try:
        return runner.run_chunk(runner.redis_client(self.app), job_id, metric_key, start, stop, deployment)
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
            raise
        raise self.retry(exc=exc, args=(job_id, metric_key, start, stop),
                         kwargs={"deployment": deployment, "blips": blips + 1},
                         countdown=min(60, 2 ** blips), max_retries=self.request.retries + 1)


@redis_task(name="evalq.finalize")
def finalize(self, job_id: str) -> dict:
    return aggregation.finalize(runner.redis_client(self.app), job_id)


@redis_task(name="evalq.generated")
def generated(self, job_id: str) -> dict:
    return aggregation.generated(runner.redis_client(self.app), job_id)
