"""Thin Celery tasks: a JSON payload in, the runner does the work, a small summary out."""

from __future__ import annotations

import redis

from workers import runner
from workers.app import app


@app.task(
    name="evalq.score_chunk",
    bind=True,
    autoretry_for=(redis.ConnectionError, redis.TimeoutError),
    retry_backoff=True,
    max_retries=5,
)
def score_chunk(self, job_id: str, metric_key: str, start: int, stop: int) -> dict:
    return runner.run_chunk(runner.redis_client(self.app), job_id, metric_key, start, stop)


@app.task(
    name="evalq.finalize",
    bind=True,
    autoretry_for=(redis.ConnectionError, redis.TimeoutError),
    retry_backoff=True,
    max_retries=5,
)
def finalize(self, job_id: str) -> dict:
    return runner.finalize(runner.redis_client(self.app), job_id)
