"""What a task does around a pure metric function: read the chunk's instances
from Redis, score each item (a failure is recorded on that item), write item
records idempotently, and aggregate when the job's last chunk is done."""

from __future__ import annotations

import json
import logging
import os
import time
import traceback
from functools import lru_cache
from typing import Any

import redis

import shared.metrics  # noqa: F401  (registers the built-in metrics)
from shared import keys
from shared.aggregate import aggregator_for
from shared.registry import REGISTRY, MetricSpec

log = logging.getLogger("evalq.worker")

_clients: dict[tuple[int, str], redis.Redis] = {}


def redis_client(celery_app) -> redis.Redis:
    """One connection pool per process and URL (created after fork, never shared)."""
    url = celery_app.conf.broker_url
    key = (os.getpid(), url)
    if key not in _clients:
        _clients[key] = redis.Redis.from_url(url)
    return _clients[key]


@lru_cache(maxsize=64)
def _job_spec(r: redis.Redis, job_id: str) -> dict:
    # A job's spec never changes once submitted, so it is cached per process.
    raw = r.get(keys.spec(job_id))
    if raw is None:
        raise LookupError(f"job {job_id} has no spec in Redis (expired or never submitted)")
    return json.loads(raw)


@lru_cache(maxsize=256)
def _metric(r: redis.Redis, job_id: str, metric_key: str) -> tuple[MetricSpec, Any, Any]:
    entry = _job_spec(r, job_id)["metrics"][metric_key]
    spec = REGISTRY.get(entry["id"])
    return spec, spec.params.model_validate(entry["parameters"]), entry.get("prepared")


def score_items(spec: MetricSpec, params: Any, instances: list[dict], prepared: Any = None) -> list[dict]:
    """Score instances; an exception becomes an ``error`` on that item only."""
    fn = spec.load()
    extra = (prepared,) if spec.prepare else ()
    if spec.batch:
        try:
            outcomes = fn(instances, params, *extra)
        except Exception as exc:  # the whole batch failed: record it on each item
            outcomes = [exc] * len(instances)
    else:
        outcomes = []
        for inst in instances:
            try:
                outcomes.append(fn(inst, params, *extra))
            except Exception as exc:
                outcomes.append(exc)
    records = []
    for inst, outcome in zip(instances, outcomes):
        record: dict[str, Any] = {"instance_id": inst["id"]}
        if isinstance(outcome, Exception):
            record["error"] = f"{type(outcome).__name__}: {outcome}"
            log.warning("item %r of %s failed: %s", inst["id"], spec.id,
                        "".join(traceback.format_exception_only(outcome)).strip())
        else:
            record["result"] = outcome
        records.append(record)
    return records


def run_chunk(r: redis.Redis, job_id: str, metric_key: str, start: int, stop: int) -> dict:
    spec, params, prepared = _metric(r, job_id, metric_key)
    spec.load()  # imports stay out of the timing below
    instances = [json.loads(x) for x in r.lrange(keys.instances(job_id), start, stop - 1)]
    t0 = time.perf_counter()
    records = score_items(spec, params, instances, prepared)
    elapsed = time.perf_counter() - t0
    mapping = {str(start + i): json.dumps(rec) for i, rec in enumerate(records)}
    pipe = r.pipeline(transaction=True)
    # HSET by instance position: a redelivered chunk overwrites, it never adds.
    pipe.hset(keys.results(job_id, metric_key), mapping=mapping)
    pipe.hset(keys.timings(job_id, metric_key), str(start), elapsed)
    pipe.execute()
    # Deterministic return value: the chord join stores it, and a redelivered
    # run must produce the very same entry.
    return {"metric": metric_key, "start": start, "n": len(records)}


def finalize(r: redis.Redis, job_id: str) -> dict:
    """Aggregate every metric of the job into the results.json content.

    Idempotent: it only reads item records and overwrites the summary, so a
    second run (a redelivered callback) writes the same thing.
    """
    spec = _job_spec(r, job_id)
    total = spec["n_instances"]
    summary = []
    for metric_key, entry in spec["metrics"].items():
        metric = REGISTRY.get(entry["id"])
        agg = aggregator_for(metric.aggregation)
        seen = 0
        for _, raw in r.hscan_iter(keys.results(job_id, metric_key), count=5000):
            agg.add(json.loads(raw))
            seen += 1
        elapsed = sum(float(v) for v in r.hvals(keys.timings(job_id, metric_key)))
        out = {
            "metric": entry["id"],
            "parameters": entry["parameters"],
            "score": agg.score(),
            "elapsed_time": round(elapsed, 6),
            "n": agg.n,
            "n_errors": agg.n_errors,
        }
        if metric_key != entry["id"]:
            out["name"] = metric_key
        if seen < total:
            out["n_missing"] = total - seen
            log.error("job %s metric %s: %d of %d items have no record", job_id, metric_key,
                      total - seen, total)
        summary.append(out)
    pipe = r.pipeline(transaction=True)
    pipe.set(keys.summary(job_id), json.dumps(summary))
    pipe.set(keys.status(job_id), "done")
    pipe.execute()
    return {"job": job_id, "status": "done"}
