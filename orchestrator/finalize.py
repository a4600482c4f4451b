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

from evalq.results.recording import record_job
from evalq.shared.cluster import keys
from evalq.shared.scores.aggregate import AGGREGATORS, AGREEMENT_KINDS, Agreement, aggregator_for, merge_parts
from evalq.shared.core.config import Settings
from evalq.shared.job.schema import entry_head
from evalq.shared.judging.judges import NANO, JudgeConfig
from evalq.shared.model.runners import GENERATE, GENERATE_SPEC, parse_model_config
from evalq.shared.metrics.registry import REGISTRY, MetricSpec
from evalq.shared.cluster.spec import METRICS_STAGE, is_model_run, run_keys, span, stage_runs, stored_spec, variants_key
from evalq.shared.cluster.status import Status, status_of
from evalq.shared.store import records as stored_records

log = logging.getLogger("evalq.worker")

ACCOUNTING_FIELDS = ("calls", "cache_hits", "reused", "prompt_tokens", "completion_tokens", "reserved_tokens",
                     "rate_limited", "failed_calls")
COST_FIELD = "cost_nano"  # the accounting hash's integer cost; outputs show it as ``cost``
BATCH_COST_FIELD = "batch_cost_nano"  # of it, what batch lines cost (evalq.workers.judge.batches)
BATCH_FIELDS = ("calls", "prompt_tokens", "completion_tokens", "failed_lines")


# aggregations whose score is means (beside what they add), with an interval beside the score
MEAN_LIKE = ("mean", "distribution", "classification", "toxicity", "robustness")


def summarize(r: redis.Redis, job_id: str, key: str, entry: dict, metric: MetricSpec, total: int,
              priced: bool = False) -> dict:
    """One metric's (or the generation stage's) aggregate: merged from its
    chunks' parts when every item is covered by one, else over the item records.
    ``priced``: its endpoint has a price (``endpoint_priced``), so its spend has a cost."""
    params = entry["parameters"]
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
        for _, raw in stored_records.scan(r, stored_spec(r, job_id), job_id, key):
            record = json.loads(raw)
            overall.add(record)
            if agreement is not None:
                agreement.add(record)
            category = record.get("category")
            if category is not None:
                by_category.setdefault(category, aggregator_for(metric.aggregation, params)).add(record)
            seen += 1
    elapsed = sum(float(v) for v in r.hvals(keys.timings(job_id, key)))
    counts = _counts(overall)
    out = {**entry_head(entry), "score": counts.pop("score")}
    if metric.aggregation in MEAN_LIKE and overall.n:
        out["ci95"] = overall.intervals(metric.bounds)  # beside the score (ratings and defect rates carry theirs inside it)
    out.update({"elapsed_time": round(elapsed, 6), **counts})
    if by_category:
        out["categories"] = {c: _counts(by_category[c]) for c in sorted(by_category)}
    if agreement is not None and agreement.result() is not None:
        out["agreement"] = agreement.result()
    if metric.calls_endpoint:
        judge = judge_accounting(r.hgetall(keys.accounting(job_id, key)), priced)
        if seen:  # what one item cost: paid calls and tokens
            judge["calls_per_item"] = round(judge["calls"] / seen, 3)
            judge["tokens_per_item"] = round((judge["prompt_tokens"] + judge["completion_tokens"]) / seen, 1)
        name = (entry.get("parameters") or {}).get("judge")
        spec = stored_spec(r, job_id)  # (read once: the identity and the learned limits both need it)
        judges = (spec.get("judges") or {}) if isinstance(name, str) and key != GENERATE else {}
        if name in judges:  # who judged, as the history compares runs by it
            from evalq.shared.judging.judges import judge_identity, panel_identity

            try:
                said, asked = r.hgetall(keys.judge_seen(job_id, key)), entry.get("parameters") or {}
                judge["identity"] = (panel_identity(judges, said, asked) if asked.get("panel")
                                     else judge_identity(judges[name], said, asked, name))
            except (ValueError, KeyError) as exc:  # a spec an older evalq stored: recorded without one
                log.warning("job %s %s: no judge identity: %s", job_id, key, exc)
        _learned_limits(r, spec, job_id, key, judge, name)
        out["judge"] = judge
    if seen < total:
        out["n_missing"] = total - seen
        log.error("job %s %s: %d of %d items have no record", job_id, key, total - seen, total)
    return out


def _learned_limits(r: redis.Redis, spec: dict, job_id: str, key: str, judge: dict, name) -> None:
    """``judge.limits``: how the learned limits of the entry's deployments moved during the job
    (``evalq.shared.judging.capacity``; as Inspect keeps its connection limit's history)."""
    from datetime import datetime

    from evalq.orchestrator.limits import limits_during

    if is_model_run(key):
        configs = [spec.get("model")]
    else:
        judges = spec.get("judges") or {}
        configs = [judges.get(n) for n in (name if isinstance(name, list) else [name]) if isinstance(n, str)]
    limits: dict = {}
    try:
        since = datetime.fromisoformat(spec["submitted_at"]).timestamp() - 1 if spec.get("submitted_at") else 0.0
        for config in configs:
            if isinstance(config, dict):
                limits.update(limits_during(r, config, job_id, since))
    except (ValueError, KeyError) as exc:
        log.warning("job %s %s: no limit history: %s", job_id, key, exc)
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
                                                       "judge") if k in variants}
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


def endpoint_priced(spec: dict, key: str, entry: dict) -> bool:
    """Whether the endpoint a run calls (its judge, or the model under test) has a price."""
    if is_model_run(key):
        return bool(getattr(parse_model_config(spec["model"]), "priced", False)) if "model" in spec else False
    names = entry["parameters"].get("panel") or [entry["parameters"].get("judge")]  # a panel: any member's
    return any(n in spec.get("judges", {}) and JudgeConfig.model_validate(spec["judges"][n]).priced for n in names)


def _counts(agg) -> dict:
    out = {"score": agg.score(), "n": agg.n, "n_errors": agg.n_errors}
    if agg.n_skipped:
        out["n_skipped"] = agg.n_skipped
    if getattr(agg, "n_not_applicable", 0):  # items the metric had nothing to score in: not errors
        out["n_not_applicable"] = agg.n_not_applicable
    return out


def finalize(r: redis.Redis, job_id: str, status: str = Status.DONE) -> dict:
    """The job's last step: aggregate every metric entry into the results.json
    content, write the outputs to the job's ``out`` (when it has one), set the
    final status and answer ``reply_to``. Idempotent: a second run rewrites the
    same files, and the reply is pushed once."""
    spec = stored_spec(r, job_id)
    if status_of(r, job_id) == Status.CANCELLED:
        status = Status.CANCELLED
    summary = [with_variants(r, job_id, key, summarize(r, job_id, key, entry, REGISTRY.get(entry["id"]),
                                                       span(spec, entry), endpoint_priced(spec, key, entry)))
               for key, entry in stage_runs(spec, METRICS_STAGE)]
    if status != Status.CANCELLED:  # scores no chunk could send to the job's sinks (evalq.results.sinks)
        from evalq.results.sinks import export_rest, with_exports

        with_exports(summary, stage_runs(spec, METRICS_STAGE), export_rest(r, job_id, spec))
    r.set(keys.summary(job_id), json.dumps(summary))
    errors: list[str] = []
    if spec.get("out"):
        errors = _write(r, spec, job_id, summary, status)
    final = Status.FAILED if errors else status
    # in the history store before the status says so: whoever sees the job end finds it there
    record_job(r, job_id, spec, final, summary, "; ".join(errors) or None)
    pipe = r.pipeline(transaction=True)
    if errors:
        pipe.set(keys.error(job_id), "; ".join(errors))
    _end(pipe, job_id, final)
    _expire(pipe, job_id, spec)
    pipe.execute()
    reply(r, job_id, spec, final, errors, summary)
    return {"job": job_id, "status": final}


def fail(r: redis.Redis, job_id: str, error: str) -> dict:
    """End a job as failed (its outputs could not be made), answering ``reply_to``."""
    spec = json.loads(r.get(keys.spec(job_id)) or "{}")
    record_job(r, job_id, spec, Status.FAILED, None, error)
    pipe = r.pipeline(transaction=True)
    pipe.set(keys.error(job_id), error)
    _end(pipe, job_id, Status.FAILED)
    if spec:
        _expire(pipe, job_id, spec)
    pipe.execute()
    if spec:
        reply(r, job_id, spec, Status.FAILED, [error], None)
    return {"job": job_id, "status": Status.FAILED}


def _end(pipe, job_id: str, status: str) -> None:
    """The final status, and the word to the clients blocked waiting for it (``keys.ended``)."""
    pipe.set(keys.status(job_id), status)
    pipe.delete(keys.ended(job_id))
    pipe.rpush(keys.ended(job_id), status)
    pipe.expire(keys.ended(job_id), 3600)  # until _expire's TTL, where the job's keys get one


def _expire(pipe, job_id: str, spec: dict) -> None:
    """An ended job's keys stay ``EVALQ_RESULT_TTL`` seconds (for ``evalq status``,
    a duplicate request, ``evalq report``'s inputs), then Redis forgets them."""
    ttl = spec.get("ttl") or Settings.from_env().result_ttl
    for key in keys.all_job_keys(job_id, run_keys(spec), spec.get("sinks") or []):
        pipe.expire(key, ttl)


def _write(r: redis.Redis, spec: dict, job_id: str, summary: list[dict], status: str) -> list[str]:
    """Write the outputs; a destination that fails, or that the operator's lists do not
    allow (the stored spec is not trusted: it is checked again here), gets them in the
    operator's fallback directory instead: the work is never lost to it."""
    from evalq.shared.policy.egress import destination_problem, fallback_dir
    from evalq.shared.core.errors import EvalqError
    from evalq.shared.data.storage import Destination
    from evalq.results.outputs import run_info, write_outputs

    stage = r.get(keys.stage_summary(job_id, GENERATE))
    run = run_info(spec, job_id, json.loads(stage) if stage else None, status, summary)
    dest = Destination(spec["out"], spec.get("out_endpoint_url"))
    refused = destination_problem(dest.uri, dest.endpoint_url, tenant=spec.get("namespace"))
    try:
        if refused:
            raise EvalqError(f"not written there: {refused}")
        write_outputs(r, spec, job_id, summary, run, dest)
        return []
    except redis.RedisError:
        raise  # the callback is retried; the destination is not at fault
    except Exception as exc:  # noqa: BLE001  (S3 and file system errors of every kind: never lose the work)
        if not isinstance(exc, (EvalqError, OSError)):
            exc = f"{type(exc).__name__}: {exc}"
        fallback = Destination(fallback_dir(job_id))
        log.error("job %s: writing to %s failed (%s); writing to %s", job_id, dest, exc, fallback)
        try:
            write_outputs(r, spec, job_id, summary, run, fallback)
        except (EvalqError, OSError) as exc2:
            return [f"writing to {dest} failed ({exc}), and to {fallback} ({exc2})"]
        return [f"writing to {dest} failed ({exc}); the outputs are in {fallback} instead"]


def reply(r: redis.Redis, job_id: str, spec: dict, status: str, errors: list[str],
          results: list[dict] | None, request_id: str | None = None) -> int:
    """Push the end document to the ``reply_to`` of every request of the job (the
    first, whose list is in the spec, and each duplicate): exactly one per request,
    whatever runs twice (a re-run callback, a redelivered message). Two requests
    naming the same list get two documents. Returns how many were pushed."""
    targets = ([(FIRST_REQUEST, spec["reply_to"])] if spec.get("reply_to") else []) + \
        sorted(_reply_target(m) for m in r.smembers(keys.reply_targets(job_id)))
    if not targets:
        return 0
    doc = json.dumps(reply_document(spec.get("request_id", request_id), job_id, status, spec.get("out"),
                                    errors, results), ensure_ascii=False)
    pushed = 0
    for request, target in targets:
        if r.sadd(keys.replied(job_id), request):
            push_reply(r, target, doc, spec.get("ttl"))
            pushed += 1
    r.expire(keys.replied(job_id), spec.get("ttl") or 7 * 24 * 3600)
    return pushed


# What ``replied`` holds for the job's first request; a duplicate's is ``msg:<its message id>``.
FIRST_REQUEST = "first"


def _reply_target(member: bytes) -> tuple[str, str]:
    """(request, reply list) of a ``reply_targets`` member; a member written before
    requests were told apart is a bare list name, answered once as before."""
    text = member.decode()
    if text.startswith("["):
        message_id, target = json.loads(text)
        return request_key(message_id), target
    return text, text


def request_key(message_id: str) -> str:
    return f"msg:{message_id}"


def reply_targets_add(r: redis.Redis, job_id: str, message_id: str, target: str) -> None:
    """Answer the duplicate request carried by message ``message_id`` on ``target``
    when the job ends (a redelivery of that message adds nothing new)."""
    r.sadd(keys.reply_targets(job_id), json.dumps([message_id, target]))
    r.expire(keys.reply_targets(job_id), 7 * 24 * 3600)


def replay(r: redis.Redis, job_id: str, request_id: str | None, status: str) -> int:
    """Answer reply lists added after the job ended (duplicate requests)."""
    spec = json.loads(r.get(keys.spec(job_id)) or "{}")
    raw_error = (r.get(keys.error(job_id)) or b"").decode()
    if status == Status.INVALID:
        errors = json.loads(raw_error) if raw_error else []
    else:
        errors = [raw_error] if raw_error else []
    summary = r.get(keys.summary(job_id))
    results = json.loads(summary) if summary and status in (Status.DONE, Status.CANCELLED) else None
    return reply(r, job_id, spec, status, errors, results, request_id)


REPLIES_KEPT = 100  # documents a reply list keeps (a pipeline pops each as it comes)


def push_reply(r: redis.Redis, target: str, doc: str, ttl: int | None = None) -> None:
    """Push one end document onto a reply list, which is then bounded by what the cluster writes
    there: its last ``REPLIES_KEPT`` documents, for ``ttl`` (the result TTL) after the last. A
    tenant's Redis user cannot write its reply lists (``evalq.shared.cluster.tenant_acl``, Redis 7);
    on an older Redis this still bounds what it pushed there, at the cluster's next answer."""
    pipe = r.pipeline(transaction=False)
    reply_ops(pipe, target, doc, ttl)
    pipe.execute()


def reply_ops(pipe, target: str, doc: str, ttl: int | None = None) -> None:
    """``push_reply``'s commands, added to ``pipe`` (a caller's transaction that marks the request
    answered in the same step)."""
    from evalq.shared.core.config import Settings

    pipe.rpush(target, doc)
    pipe.ltrim(target, -REPLIES_KEPT, -1)
    pipe.expire(target, int(ttl or Settings.from_env().result_ttl))


def reply_document(request_id: str | None, job_id: str | None, status: str, out: str | None,
                   errors: list[str], results: list[dict] | None) -> dict:
    return {"request_id": request_id, "job_id": job_id, "status": status, "out": out, "errors": errors,
            "results": results}


def generated(r: redis.Redis, job_id: str) -> dict:
    """Callback of the generation stage: its summary, then status ``generated``
    (the orchestrator submits the metrics on seeing it)."""
    spec = stored_spec(r, job_id)
    pipe = r.pipeline(transaction=True)
    if GENERATE in spec:
        entry = spec[GENERATE]
        summary = summarize(r, job_id, GENERATE, entry, GENERATE_SPEC, entry["n_items"],
                            endpoint_priced(spec, GENERATE, entry))
        score = summary.pop("score") or {}  # means over the outputs: only log probabilities are numbers
        if score.get("log_probability") is not None:
            summary["mean_log_probability"] = score["log_probability"]
        pipe.set(keys.stage_summary(job_id, GENERATE), json.dumps(summary))
    for key, entry in (spec.get("variants") or {}).items():
        vkey = variants_key(key)
        summary = summarize(r, job_id, vkey, entry, REGISTRY.get(entry["id"]).variants_spec(), span(spec, entry),
                            endpoint_priced(spec, vkey, entry))
        summary.pop("score", None)
        pipe.set(keys.stage_summary(job_id, vkey), json.dumps(summary))
    pipe.set(keys.status(job_id), Status.GENERATED)
    pipe.execute()
    return {"job": job_id, "status": Status.GENERATED}
