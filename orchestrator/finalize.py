"""A job's end: each stage's callback (``generated`` for the generation stage, ``finalize`` for the
job), which sums its entries up (``evalq.results.summary``), writes the outputs, records the job in
history, sets the final status, lets the job's keys expire and answers its requests
(``evalq.orchestrator.replies``). Idempotent: a redelivered callback writes the same things, and
each request is answered once.
"""

from __future__ import annotations

import json
import logging

import redis

from evalq.orchestrator.replies import reply
from evalq.results.recording import foresee, record_job, with_regressions
from evalq.results.summary import summarize, with_variants
from evalq.shared.cluster import keys
from evalq.shared.cluster.spec import METRICS_STAGE, run_keys, span, stage_runs, variants_key
from evalq.shared.cluster.status import Status, status_of
from evalq.shared.job.stored import StoredJob, load_job, stored_job
from evalq.shared.metrics.registry import REGISTRY
from evalq.shared.model.runners import GENERATE, GENERATE_SPEC

log = logging.getLogger("evalq.worker")


def finalize(r: redis.Redis, job_id: str, status: str = Status.DONE) -> dict:
    """The job's last step: aggregate every metric entry into the results.json
    content, write the outputs to the job's ``out`` (when it has one), set the
    final status and answer ``reply_to``. Idempotent: a second run rewrites the
    same files, and the reply is pushed once."""
    spec = stored_job(r, job_id)
    if status_of(r, job_id) == Status.CANCELLED:
        status = Status.CANCELLED
    with spec.records.holding():  # each record part read from the store once (the report, log, history)
        return _finalize(r, job_id, spec, status)


def _finalize(r: redis.Redis, job_id: str, spec: StoredJob, status: str) -> dict:
    summary = [with_variants(r, job_id, key,
                             summarize(r, spec, key, entry, REGISTRY.get(entry.id), span(spec, entry)))
               for key, entry in stage_runs(spec, METRICS_STAGE)]
    if status != Status.CANCELLED:  # scores no chunk could send to the job's sinks (evalq.results.sinks)
        from evalq.results.sinks import export_rest, with_exports

        with_exports(summary, stage_runs(spec, METRICS_STAGE), export_rest(r, job_id, spec))
    # the regressions against the suite's baseline, found before the outputs are written: they say them
    foreseen = foresee(r, job_id, spec, summary) if status == Status.DONE else None
    regressions = with_regressions(summary, foreseen)
    r.set(keys.summary(job_id), json.dumps(summary))
    if regressions is not None:  # what `evalq run` says of it (the dataset's move, the count)
        r.set(keys.compared(job_id), json.dumps(regressions), ex=spec.ttl)
    errors: list[str] = []
    if spec.destination is not None:
        errors = _write(r, spec, job_id, summary, status, regressions, foreseen.baseline if foreseen else None)
    final = Status.FAILED if errors else status
    # in the history store before the status says so: whoever sees the job end finds it there
    record_job(r, job_id, spec, final, summary, "; ".join(errors) or None, foreseen)
    pipe = r.pipeline(transaction=True)
    if errors:
        pipe.set(keys.error(job_id), "; ".join(errors))
    _end(pipe, job_id, final)
    _expire(pipe, job_id, spec)
    pipe.execute()
    _unmark(spec, job_id)
    reply(r, job_id, spec, final, errors, summary)
    return {"job": job_id, "status": final}


def fail(r: redis.Redis, job_id: str, error: str) -> dict:
    """End a job as failed (its outputs could not be made), answering ``reply_to``."""
    spec = load_job(r, job_id) or StoredJob({}, job_id)
    record_job(r, job_id, spec, Status.FAILED, None, error)
    pipe = r.pipeline(transaction=True)
    pipe.set(keys.error(job_id), error)
    _end(pipe, job_id, Status.FAILED)
    if spec:
        _expire(pipe, job_id, spec)
    pipe.execute()
    _unmark(spec, job_id)
    if spec:
        reply(r, job_id, spec, Status.FAILED, [error], None)
    return {"job": job_id, "status": Status.FAILED}


def _unmark(spec: StoredJob, job_id: str) -> None:
    """The job has ended: the store no longer says it runs (``evalq.shared.store.ledger``), so no
    cluster that loses its Redis later rebuilds it."""
    if spec.running:
        from evalq.shared.store.ledger import ended
        from evalq.shared.store.place import StoreUnavailable

        try:
            ended(spec.running, job_id, spec.binding)
        except StoreUnavailable as exc:  # the job's end stands; a later rebuild finds every chunk done
            log.error("job %s: its marker in the job store could not be removed: %s", job_id, exc)


def _end(pipe, job_id: str, status: str) -> None:
    """The final status, and the word to the clients blocked waiting for it (``keys.ended``)."""
    pipe.set(keys.status(job_id), status)
    pipe.delete(keys.ended(job_id))
    pipe.rpush(keys.ended(job_id), status)
    pipe.expire(keys.ended(job_id), 3600)  # until _expire's TTL, where the job's keys get one


def _expire(pipe, job_id: str, spec: StoredJob) -> None:
    """An ended job's keys stay ``EVALQ_RESULT_TTL`` seconds (for ``evalq status``,
    a duplicate request, ``evalq report``'s inputs), then Redis forgets them."""
    ttl = spec.ttl
    for key in keys.all_job_keys(job_id, run_keys(spec), spec.sinks):
        pipe.expire(key, ttl)


def _write(r: redis.Redis, spec: StoredJob, job_id: str, summary: list[dict], status: str,
           regressions: dict | None = None, baseline: dict | None = None) -> list[str]:
    """Write the outputs; a destination that fails, or that the operator's lists do not
    allow (the stored spec is not trusted: it is checked again here), gets them in the
    operator's fallback directory instead: the work is never lost to it."""
    from evalq.shared.policy.egress import destination_problem, fallback_dir
    from evalq.shared.core.errors import EvalqError
    from evalq.shared.data.storage import Destination
    from evalq.results.outputs import run_info, write_outputs

    stage = r.get(keys.stage_summary(job_id, GENERATE))
    run = run_info(spec, job_id, json.loads(stage) if stage else None, status, summary, regressions)
    dest = spec.destination
    refused = destination_problem(dest.uri, dest.endpoint_url, tenant=spec.namespace)
    try:
        if refused:
            raise EvalqError(f"not written there: {refused}")
        write_outputs(r, spec, job_id, summary, run, dest, baseline)
        return []
    except redis.RedisError:
        raise  # the callback is retried; the destination is not at fault
    except Exception as exc:  # noqa: BLE001  (S3 and file system errors of every kind: never lose the work)
        if not isinstance(exc, (EvalqError, OSError)):
            exc = f"{type(exc).__name__}: {exc}"
        fallback = Destination(fallback_dir(job_id))
        log.error("job %s: writing to %s failed (%s); writing to %s", job_id, dest, exc, fallback)
        try:
            write_outputs(r, spec, job_id, summary, run, fallback, baseline)
        except (EvalqError, OSError) as exc2:
            return [f"writing to {dest} failed ({exc}), and to {fallback} ({exc2})"]
        return [f"writing to {dest} failed ({exc}); the outputs are in {fallback} instead"]


def generated(r: redis.Redis, job_id: str) -> dict:
    """Callback of the generation stage: its summary, then status ``generated``
    (the orchestrator submits the metrics on seeing it)."""
    spec = stored_job(r, job_id)
    pipe = r.pipeline(transaction=True)
    entry = spec.generate
    if entry is not None:
        summary = summarize(r, spec, GENERATE, entry, GENERATE_SPEC, entry.n_items)
        score = summary.pop("score") or {}  # means over the outputs: only log probabilities are numbers
        if score.get("log_probability") is not None:
            summary["mean_log_probability"] = score["log_probability"]
        pipe.set(keys.stage_summary(job_id, GENERATE), json.dumps(summary))
    for key, entry in spec.variants.items():
        vkey = variants_key(key)
        summary = summarize(r, spec, vkey, entry, REGISTRY.get(entry.id).variants_spec(), span(spec, entry))
        summary.pop("score", None)
        pipe.set(keys.stage_summary(job_id, vkey), json.dumps(summary))
    pipe.set(keys.status(job_id), Status.GENERATED)
    pipe.execute()
    return {"job": job_id, "status": Status.GENERATED}
