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
from shared.errors import Deferred, Skipped
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


@lru_cache(maxsize=256)
def _judge_config(r: redis.Redis, job_id: str, name: str):
    from shared.judges import JudgeConfig, JudgingOptions

    spec = _job_spec(r, job_id)
    return JudgeConfig.model_validate(spec["judges"][name]), JudgingOptions.model_validate(spec["judging"])


def judge_client(r: redis.Redis, job_id: str, metric_key: str, params: Any, deployment: str | None):
    from workers.judge.client import JudgeClient

    judge, options = _judge_config(r, job_id, params.judge)
    return JudgeClient(r, job_id, metric_key, params.judge, judge, options, preferred=deployment)


def score_items(spec: MetricSpec, params: Any, instances: list[dict], prepared: Any = None,
                judge: Any = None) -> list[dict]:
    """Score instances; an exception becomes an ``error`` on that item only.

    Metrics with a ``prepare`` hook get its result, judge metrics a judge
    client, as further arguments. ``Deferred`` propagates (the task
    re-schedules) carrying the records made so far in ``partial``;
    ``Skipped`` marks the item as not run.
    """
    fn = spec.load()
    extra = ((prepared,) if spec.prepare else ()) + ((judge,) if spec.queue == "judge" else ())
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
            except Deferred as exc:
                exc.partial = _records(spec, instances[:len(outcomes)], outcomes)
                raise
            except Exception as exc:
                outcomes.append(exc)
    return _records(spec, instances, outcomes)


def _records(spec: MetricSpec, instances: list[dict], outcomes: list) -> list[dict]:
    records = []
    for inst, outcome in zip(instances, outcomes):
        record: dict[str, Any] = {"instance_id": inst["id"]}
        if isinstance(outcome, Skipped):
            record["skipped"] = str(outcome)
        elif isinstance(outcome, Exception):
            record["error"] = f"{type(outcome).__name__}: {outcome}"
            log.warning("item %r of %s failed: %s", inst["id"], spec.id,
                        "".join(traceback.format_exception_only(outcome)).strip())
        else:
            record["result"] = outcome
        records.append(record)
    return records


def run_chunk(r: redis.Redis, job_id: str, metric_key: str, start: int, stop: int,
              deployment: str | None = None) -> dict:
    spec, params, prepared = _metric(r, job_id, metric_key)
    spec.load()  # imports stay out of the timing below
    positions = list(range(start, stop))
    if spec.queue == "judge":
        # A re-scheduled or redelivered judge chunk does not pay twice for
        # items already recorded.
        done = r.hmget(keys.results(job_id, metric_key), [str(p) for p in positions])
        positions = [p for p, rec in zip(positions, done) if rec is None]
    instances = _instances(r, job_id, positions)
    judge = judge_client(r, job_id, metric_key, params, deployment) if spec.queue == "judge" else None
    t0 = time.perf_counter()
    try:
        records = score_items(spec, params, instances, prepared, judge)
    except Deferred as exc:
        _write(r, job_id, metric_key, start, positions, exc.partial, time.perf_counter() - t0)
        raise
    _write(r, job_id, metric_key, start, positions, records, time.perf_counter() - t0)
    # Deterministic return value: the chord join stores it, and a redelivered
    # run must produce the very same entry.
    return {"metric": metric_key, "start": start, "n": len(records)}


def _instances(r: redis.Redis, job_id: str, positions: list[int]) -> list[dict]:
    if not positions:
        return []
    lo, hi = positions[0], positions[-1]
    raw = r.lrange(keys.instances(job_id), lo, hi)
    return [json.loads(raw[p - lo]) for p in positions]


def _write(r: redis.Redis, job_id: str, metric_key: str, start: int, positions: list[int],
           records: list[dict], elapsed: float) -> None:
    pipe = r.pipeline(transaction=True)
    if records:
        # HSET by instance position: a redelivered chunk overwrites, it never adds.
        pipe.hset(keys.results(job_id, metric_key),
                  mapping={str(p): json.dumps(rec) for p, rec in zip(positions, records)})
    pipe.hincrbyfloat(keys.timings(job_id, metric_key), str(start), elapsed)
    pipe.execute()


ACCOUNTING_FIELDS = ("calls", "cache_hits", "prompt_tokens", "completion_tokens", "reserved_tokens",
                     "rate_limited", "failed_calls")


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
        agg = aggregator_for(metric.aggregation, entry["parameters"])
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
        if agg.n_skipped:
            out["n_skipped"] = agg.n_skipped
        if metric.queue == "judge":
            acct = r.hgetall(keys.accounting(job_id, metric_key))
            out["judge"] = {f: int(acct.get(f.encode(), 0)) for f in ACCOUNTING_FIELDS}
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
