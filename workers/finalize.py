"""Aggregation: item records in Redis -> the summary ``results.json`` shows.

Each metric aggregates by its registry entry's ``aggregation``, overall and per
category (an instance's ``category``, e.g. from fmeval's ``category_location``).
Idempotent: it only reads item records and overwrites the summary, so a
redelivered callback writes the same thing.
"""

from __future__ import annotations

import json
import logging

import redis

from evalq.shared import keys
from evalq.shared.aggregate import AGGREGATORS, aggregator_for, merge_parts
from evalq.shared.model import GENERATE, GENERATE_SPEC
from evalq.shared.registry import REGISTRY, MetricSpec
from evalq.workers.runner import job_spec

log = logging.getLogger("evalq.worker")

ACCOUNTING_FIELDS = ("calls", "cache_hits", "prompt_tokens", "completion_tokens", "reserved_tokens",
                     "rate_limited", "failed_calls")


def summarize(r: redis.Redis, job_id: str, key: str, entry: dict, metric: MetricSpec, total: int) -> dict:
    """One metric's (or the generation stage's) aggregate: merged from its
    chunks' parts when every item is covered by one, else over the item records."""
    params = entry["parameters"]
    overall, by_category, seen = None, {}, 0
    if AGGREGATORS[metric.aggregation].mergeable:
        parts = (json.loads(raw) for raw in r.hvals(keys.parts(job_id, key)))
        overall, by_category, seen = merge_parts(metric.aggregation, params, parts)
        if seen < total:  # a chunk without its part (never expected): read the items instead
            overall = None
    if overall is None:
        overall, by_category, seen = aggregator_for(metric.aggregation, params), {}, 0
        for _, raw in r.hscan_iter(keys.results(job_id, key), count=5000):
            record = json.loads(raw)
            overall.add(record)
            category = record.get("category")
            if category is not None:
                by_category.setdefault(category, aggregator_for(metric.aggregation, params)).add(record)
            seen += 1
    elapsed = sum(float(v) for v in r.hvals(keys.timings(job_id, key)))
    counts = _counts(overall)
    out = {"metric": entry["id"]}
    if entry.get("name") is not None:
        out["name"] = entry["name"]
    out.update({"parameters": params, "score": counts.pop("score"), "elapsed_time": round(elapsed, 6), **counts})
    if by_category:
        out["categories"] = {c: _counts(by_category[c]) for c in sorted(by_category)}
    if metric.calls_endpoint:
        acct = r.hgetall(keys.accounting(job_id, key))
        out["judge"] = {f: int(acct.get(f.encode(), 0)) for f in ACCOUNTING_FIELDS}
    if seen < total:
        out["n_missing"] = total - seen
        log.error("job %s %s: %d of %d items have no record", job_id, key, total - seen, total)
    return out


def _counts(agg) -> dict:
    out = {"score": agg.score(), "n": agg.n, "n_errors": agg.n_errors}
    if agg.n_skipped:
        out["n_skipped"] = agg.n_skipped
    return out


def finalize(r: redis.Redis, job_id: str) -> dict:
    """Aggregate every metric of the job into the results.json content."""
    spec = job_spec(r, job_id)
    summary = [summarize(r, job_id, key, entry, REGISTRY.get(entry["id"]), spec["n_instances"])
               for key, entry in spec["metrics"].items()]
    pipe = r.pipeline(transaction=True)
    pipe.set(keys.summary(job_id), json.dumps(summary))
    pipe.set(keys.status(job_id), "done")
    pipe.execute()
    return {"job": job_id, "status": "done"}


def generated(r: redis.Redis, job_id: str) -> dict:
    """Callback of the generation stage: its summary, then status ``generated``
    (the orchestrator submits the metrics on seeing it)."""
    spec = job_spec(r, job_id)
    entry = spec[GENERATE]
    summary = summarize(r, job_id, GENERATE, entry, GENERATE_SPEC, entry["n_items"])
    score = summary.pop("score") or {}  # means over the outputs: only log probabilities are numbers
    if score.get("log_probability") is not None:
        summary["mean_log_probability"] = score["log_probability"]
    pipe = r.pipeline(transaction=True)
    pipe.set(keys.stage_summary(job_id, GENERATE), json.dumps(summary))
    pipe.set(keys.status(job_id), "generated")
    pipe.execute()
    return {"job": job_id, "status": "generated"}
