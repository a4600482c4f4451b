"""Where a job's scores go besides its outputs, each item's once, and never lost in silence.

The sinks are the operator's; a job only picks among them: OTLP log events (``otlp``: the standard
``OTEL_EXPORTER_OTLP_*`` default or a named exporter of ``EVALQ_OTEL_EXPORTERS``, picked by
``output.otel``), Phoenix span annotations and MLflow assessments (``phoenix``, ``mlflow``: named in
``EVALQ_SINKS``, picked by ``output.sinks``). Every sink is kept the same way (``keeping``): a
chunk's items are sent as the chunk ends, marked once the backend took them, and what a chunk could
not send goes at the job's end; run.json and results.json count per sink what was sent, skipped
(nothing to send: an error, no span or trace), refused and left unsent, with the backend's answer.
"""

from __future__ import annotations

import redis

from evalq.results.sinks.keeping import Sink, export_items
from evalq.results.sinks.keeping import export_rest as _rest, try_again
from evalq.results.sinks.otlp import sink_for as otlp_sink
from evalq.shared.job.stored import StoredJob, as_stored


def named_sink(spec: StoredJob | dict, name: str) -> Sink | None:
    """The operator's sink ``name`` for this job, or None where the operator has none of that
    name, or it is another tenant's (the stored spec is not trusted to have been checked)."""
    from evalq.shared.core.config import exporter_problem, score_sinks

    found = score_sinks().get(name)
    if found is None or exporter_problem(name, as_stored(spec).tenant, "output.sinks", "EVALQ_SINKS"):
        return None
    kind, base = found
    if kind == "phoenix":
        from evalq.results.sinks.phoenix import PhoenixSink

        return PhoenixSink(name, base)
    if kind == "mlflow":
        from evalq.results.sinks.mlflow import MlflowSink

        return MlflowSink(name, base)
    return None


def sinks_for(spec: StoredJob | dict) -> list[Sink]:
    """Every sink the job's scores go to (none for a model run's records)."""
    job = as_stored(spec)
    out: list[Sink] = []
    if job.otel_export is not False:
        otlp = otlp_sink(job)
        if otlp is not None:
            out.append(otlp)
    for name in job.sinks:
        sink = named_sink(job, name)
        if sink is not None:
            out.append(sink)
    return out


def export_chunk(r: redis.Redis, job_id: str, spec: dict, entry_key: str, entry: dict, kind: str,
                 items: list[tuple[int, dict]]) -> None:
    """A chunk's items to every sink of the job, as the chunk ends."""
    for sink in sinks_for(spec):
        export_items(r, sink, job_id, spec, entry_key, entry, kind, items)


def export_rest(r: redis.Redis, job_id: str, spec: dict) -> dict[str, dict]:
    """At the job's end: what no chunk could send, sink by sink; what each got (``keeping.export_rest``)."""
    return {sink.name: _rest(r, sink, job_id, spec) for sink in sinks_for(spec)}


def resend(r: redis.Redis, job_id: str, spec) -> dict[str, dict]:
    """An ended job's scores that did not reach a sink, sent again (``evalq resend``): each sink is
    asked again whatever it answered before, with the same identifiers (an evaluation's id is its job,
    entry and item); what a sink took before is not sent twice. What each got, as ``export_rest``."""
    out = {}
    for sink in sinks_for(spec):
        try_again(r, job_id, sink)
        out[sink.name] = _rest(r, sink, job_id, spec)
    return out


def with_exports(summary: list[dict], runs: list, sinks: dict[str, dict]) -> None:
    """Each entry of results.json with what each sink got of it (``exports.<sink>``: sent, skipped,
    unsent, and the backend's answer where something was not sent)."""
    for result, (key, _) in zip(summary, runs):
        for name, got in sinks.items():
            mine = got["entries"].get(key)
            if mine is None:
                continue
            result.setdefault("exports", {})[name] = {
                "kind": got["kind"], "endpoint": got["endpoint"], **mine,
                **({"answer": got["answer"]} if mine["unsent"] and got["answer"] else {})}


def exports_total(summary: list[dict]) -> dict | None:
    """run.json's ``exports``: per sink, the items sent, skipped and unsent over the job's entries."""
    totals: dict[str, dict] = {}
    for m in summary:
        for name, got in (m.get("exports") or {}).items():
            total = totals.setdefault(name, {"kind": got.get("kind", name), "endpoint": got["endpoint"],
                                             "sent": 0, "unsent": 0})
            total["sent"] += got["sent"]
            total["unsent"] += got["unsent"]
            for extra in ("skipped", "refused", "unreachable"):
                if got.get(extra):
                    total[extra] = total.get(extra, 0) + got[extra]
            if got.get("answer") and "answer" not in total:
                total["answer"] = got["answer"]
    return totals or None
