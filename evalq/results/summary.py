"""What a run of a job's entry sums up to (results.json's entries): its aggregate, merged from its
chunks' parts or read over its item records, per category, its agreement with people, and what its
endpoint calls cost (judge accounting, money, the limits its deployments learned meanwhile)."""

from __future__ import annotations

import json
import logging

import redis

from evalq.shared.cluster import keys
from evalq.shared.cluster.spec import is_model_run, variants_key
from evalq.shared.job.schema import entry_head
from evalq.shared.job.stored import RunEntry, StoredJob
from evalq.shared.judging.judges import NANO
from evalq.shared.metrics.registry import MetricSpec
from evalq.shared.model.runners import GENERATE
from evalq.shared.scores.aggregate import AGGREGATORS, AGREEMENT_KINDS, Agreement, aggregator_for, merge_parts

log = logging.getLogger("evalq.worker")

ACCOUNTING_FIELDS = ("calls", "cache_hits", "reused", "prompt_tokens", "completion_tokens", "reserved_tokens",
                     "rate_limited", "failed_calls")
COST_FIELD = "cost_nano"  # the accounting hash's integer cost; outputs show it as ``cost``
BATCH_COST_FIELD = "batch_cost_nano"  # of it, what batch lines cost (evalq.workers.judge.batches)
BATCH_FIELDS = ("calls", "prompt_tokens", "completion_tokens", "failed_lines")


# aggregations whose score is means (beside what they add), with an interval beside the score
MEAN_LIKE = ("mean", "distribution", "classification", "toxicity", "robustness")


def summarize(r: redis.Redis, job: StoredJob, key: str, entry: RunEntry, metric: MetricSpec, total: int) -> dict:
    """One metric's (or the generation stage's) aggregate: merged from its
    chunks' parts when every item is covered by one, else over the item records. Its spend has
    a cost where its endpoint has a price (``StoredJob.priced``)."""
    job_id = job.job_id
    params = entry.parameters
    overall, by_category, seen = None, {}, 0
    agreement = Agreement(metric.aggregation, params) if metric.aggregation in AGREEMENT_KINDS else None
    if AGGREGATORS[metric.aggregation].mergeable:
        # in chunk order, whatever order the chunks finished in: the sums are then the same
        # floats on every run of the job
        raw_parts = r.hgetall(keys.parts(job_id, key))
        parts = (json.loads(raw_parts[k]) for k in sorted(raw_parts, key=int))
        overall, by_category, seen = merge_parts(metric.aggregation, params, parts, agreement)
        if seen < total:  # a chunk without its part (never expected): read the items instead
            overall = None
            agreement = Agreement(metric.aggregation, params) if agreement is not None else None
    if overall is None:
        overall, by_category, seen = aggregator_for(metric.aggregation, params), {}, 0
        for _, raw in job.records.scan(r, key):
            record = json.loads(raw)
            overall.add(record)
            if agreement is not None:
                agreement.add(record)
            category = record.get("category")
            if category is not None:
                by_category.setdefault(category, aggregator_for(metric.aggregation, params)).add(record)
            seen += 1
    elapsed, compute = keys.timing_sums(r.hgetall(keys.timings(job_id, key)))
    counts = _counts(overall)
    out = {**entry_head(entry), "score": counts.pop("score")}
    if metric.aggregation in MEAN_LIKE and overall.n:
        out["ci95"] = overall.intervals(metric.bounds)  # beside the score (ratings and defect rates carry theirs inside it)
    # the seconds its chunks took, summed (they run side by side), and of those the CPU's: the rest
    # waited (for a judge's replies, its budget)
    out.update({"elapsed_time": round(elapsed, 6), "compute_time": round(compute, 6), **counts})
    if by_category:
        out["categories"] = {c: _counts(by_category[c]) for c in sorted(by_category)}
    if agreement is not None and agreement.result() is not None:
        out["agreement"] = agreement.result()
    if metric.calls_endpoint:
        judge = judge_accounting(r.hgetall(keys.accounting(job_id, key)), job.priced(key, entry))
        if seen:  # what one item cost: paid calls and tokens
            judge["calls_per_item"] = round(judge["calls"] / seen, 3)
            judge["tokens_per_item"] = round((judge["prompt_tokens"] + judge["completion_tokens"]) / seen, 1)
        name = entry.parameters.get("judge")
        judges = job.judges if isinstance(name, str) and key != GENERATE else {}
        if name in judges:  # who judged, as the history compares runs by it
            from evalq.shared.judging.judges import judge_identity, panel_identity

            try:
                said, asked = r.hgetall(keys.judge_seen(job_id, key)), entry.parameters
                judge["identity"] = (panel_identity(judges, said, asked) if asked.get("panel")
                                     else judge_identity(judges[name], said, asked, name))
            except (ValueError, KeyError) as exc:  # a spec an older evalq stored: recorded without one
                log.warning("job %s %s: no judge identity: %s", job_id, key, exc)
        _learned_limits(r, job, key, judge, name)
        _retires(r, job, key, judge, entry.parameters)
        out["judge"] = judge
    if seen < total:
        out["n_missing"] = total - seen
        log.error("job %s %s: %d of %d items have no record", job_id, key, total - seen, total)
    return out


def _retires(r: redis.Redis, job: StoredJob, key: str, judge: dict, params) -> None:
    """``judge.retires``: the entry's judges (a panel's members, the model under test) whose model
    retires within ``EVALQ_RETIRE_WARN_DAYS``, as its provider's model list said it when a worker last
    asked (``evalq.workers.judge.retiring``; nothing where none has yet)."""
    from evalq.shared.judging.retirement import as_date, retiring
    from evalq.shared.policy.endpoints import endpoint_url

    names = [GENERATE] if is_model_run(key) else (params.get("panel") or [params.get("judge")])
    configs = []
    for name in names:
        try:
            config = job.endpoint(name, job.job_id)
        except (ValueError, KeyError, TypeError):  # refused by the operator's policy, or not a judge
            continue
        if getattr(config, "deployments", None) and getattr(config, "model", None):
            configs.append((name, config))

    def shutdown(config, d):
        raw = r.get(keys.retires(config.provider, endpoint_url(config.provider, d), config.model))
        return as_date(json.loads(raw).get("shutdown")) if raw else None

    found = retiring(configs, shutdown)
    if found:
        judge["retires"] = found


def _learned_limits(r: redis.Redis, job: StoredJob, key: str, judge: dict, name) -> None:
    """``judge.limits``: how the learned limits of the entry's deployments moved during the job
    (``evalq.shared.judging.capacity``; as Inspect keeps its connection limit's history)."""
    from evalq.results.limits import limits_during

    if is_model_run(key):
        configs = [job.model]
    else:
        configs = [job.judges.get(n) for n in (name if isinstance(name, list) else [name]) if isinstance(n, str)]
    limits: dict = {}
    try:
        since = job.submitted_epoch - 1 if job.submitted_at else 0.0
        for config in configs:
            if isinstance(config, dict):
                limits.update(limits_during(r, config, job.job_id, since))
    except (ValueError, KeyError) as exc:
        log.warning("job %s %s: no limit history: %s", job.job_id, key, exc)
        return
    if limits:
        judge["limits"] = limits


def with_variants(r: redis.Redis, job_id: str, key: str, summary: dict) -> dict:
    """An entry whose items needed variants from the model shows what they cost under ``variants``:
    the variants run's counts, time and model accounting (calls, tokens, cost)."""
    raw = r.get(keys.stage_summary(job_id, variants_key(key)))
    if raw is not None:
        variants = json.loads(raw)
        summary["variants"] = {k: variants[k] for k in ("n", "n_errors", "n_skipped", "n_missing", "elapsed_time",
                                                       "compute_time", "judge") if k in variants}
    return summary


def judge_accounting(acct: dict[bytes, bytes], priced: bool | None = None) -> dict:
    """A metric entry's judge accounting hash as results and ``evalq status`` show it:
    the totals, and under ``regions`` the ``<region>/<field>`` counts of each deployment.
    When its endpoint has a price (``priced``; None: when a call cost something), the
    totals and each region carry ``cost`` (the hash's integer ``cost_nano``, in units)."""
    judge: dict = {f: int(float(acct.get(f.encode(), 0))) for f in ACCOUNTING_FIELDS}
    regions: dict[str, dict[str, int]] = {}
    for k, v in acct.items():
        region, _, field = k.decode().rpartition("/")
        if region:
            regions.setdefault(region, {})[field] = int(float(v))
    costed = priced or (priced is None and COST_FIELD.encode() in acct)
    if costed:
        judge["cost"] = money(int(float(acct.get(COST_FIELD.encode(), 0))))
    by_path = _by_path(acct, judge, costed)
    if by_path is not None:
        judge["by_path"] = by_path
    for counts in regions.values():
        cost, batch_cost = counts.pop(COST_FIELD, 0), counts.pop(BATCH_COST_FIELD, 0)
        if costed:
            counts["cost"] = money(cost)
            if by_path is not None:  # without batch lines the regions read as before
                counts["batch_cost"] = money(batch_cost)
    if regions:
        judge["regions"] = dict(sorted(regions.items()))
    return judge


def _by_path(acct: dict[bytes, bytes], judge: dict, costed: bool) -> dict | None:
    """Calls, tokens (and cost) by path, sync and batch, for an entry that used the Batch API
    (None otherwise): the totals count both; the batch path's ``failed_lines`` are lines a
    batch did not answer (each went into another batch, or synchronously)."""
    batch = {f: int(float(acct.get(f"batch_{f}".encode(), 0))) for f in BATCH_FIELDS}
    if not any(batch.values()):
        return None
    sync = {f: judge[f] - batch[f] for f in ("calls", "prompt_tokens", "completion_tokens")}
    if costed:
        total, cheap = int(float(acct.get(COST_FIELD.encode(), 0))), int(float(acct.get(BATCH_COST_FIELD.encode(), 0)))
        sync["cost"], batch["cost"] = money(total - cheap), money(cheap)
    return {"sync": sync, "batch": batch}


def money(nano: int) -> float:
    """Billionths of the prices' currency as the outputs show money: rounded to 6 decimals."""
    return round(nano / NANO, 6)


def _counts(agg) -> dict:
    out = {"score": agg.score(), "n": agg.n, "n_errors": agg.n_errors}
    if agg.n_skipped:
        out["n_skipped"] = agg.n_skipped
    if getattr(agg, "n_not_applicable", 0):  # items the metric had nothing to score in: not errors
        out["n_not_applicable"] = agg.n_not_applicable
    return out
