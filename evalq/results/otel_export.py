"""Items' results out as OpenTelemetry GenAI evaluation events, as each chunk finishes.

Where they go is the operator's: the standard ``OTEL_EXPORTER_OTLP_LOGS_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_ENDPOINT`` (with ``OTEL_EXPORTER_OTLP_HEADERS``, ``..._TIMEOUT``, TLS
settings, as the OpenTelemetry SDK reads them) on the workers, or one of the exporters the operator
names in ``EVALQ_OTEL_EXPORTERS`` (``prod=https://otel.acme:4318/v1/logs;lab=...``). A job only
chooses among them (``output.otel``: unset, the default exporter where one is configured; ``false``,
none; a name, that one): it never gives an address. An exporter named ``<tenant>:<name>`` takes
that tenant's jobs' events only (``evalq.shared.core.config.exporter_problem``; checked when the
request is taken, and again here, from the stored spec's tenant).

A chunk's events (``evalq.shared.traces.events``) are sent by the SDK's OTLP/HTTP log exporter in
batches of ``BATCH`` once its records are written, each parented to the span it judges, and the
positions sent are marked in Redis (``keys.exported``) only after the collector accepted them: a
chunk run again (a worker died, the message came back) sends only what was not marked. An export
that fails is logged and left unmarked, and that process sends nothing to that collector for
``PAUSE`` seconds (a collector that is down would otherwise cost every chunk the exporter's
retries); the final callback sends what is left (``export_rest``), and logs what even it could not. Every event carries ``evalq.event.id``, the same on any resend.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import threading
import time
from functools import lru_cache
from typing import Any

import redis

from evalq.shared.cluster import keys, telemetry
from evalq.shared.core.config import exporter_problem, otel_exporters
from evalq.shared.store import records as stored_records
from evalq.shared.traces.events import EVENT_NAME, Evaluation, evaluations

log = logging.getLogger("evalq.otel")
BATCH = 512  # events per export request
# After a failed export a process leaves that collector alone this long: the exporter's own retries
# take up to its timeout (10 s), which a down collector would add to every chunk.
PAUSE = 60.0
_DOWN: dict[str, float] = {}
RETRIES = 3  # failed exports the final callback rides out before it gives the rest up
# answers that say the place takes no OTLP logs at all (Phoenix answers POST /v1/logs 405): found on
# the first try and never tried again for the job, instead of costing every chunk and the final
# callback their retries
CANNOT = (404, 405, 415, 501)
SINK = "otlp"
_ANSWER = threading.local()  # the exporter's last word in this thread (it logs it; it returns only FAILURE)


class _Answers(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        _ANSWER.text = record.getMessage()


@lru_cache(maxsize=1)
def _listen() -> None:
    logging.getLogger("opentelemetry.exporter.otlp.proto.http._log_exporter").addHandler(_Answers(logging.WARNING))


def _refusal(result: Any) -> tuple[str, bool]:
    """(what the collector answered, whether it can take no events at all)."""
    text = getattr(_ANSWER, "text", None) or str(result)
    code = re.search(r"code: (\d+)", text)
    return text, bool(code and int(code.group(1)) in CANNOT)


def default_endpoint() -> str | None:
    """The standard OTLP settings' logs endpoint, or None when none is configured."""
    logs = os.environ.get("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT")
    if logs:
        return logs
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return base.rstrip("/") + "/v1/logs" if base else None


def endpoint_for(spec: dict) -> str | None:
    """Where a job's events go: its ``output.otel`` among what the operator configured for its tenant."""
    choice = spec.get("otel_export")  # the job's output.otel: None, False or an exporter's name
    if choice is False:
        return None
    if isinstance(choice, str):
        tenant = (spec.get("scheduling") or {}).get("tenant")
        return None if exporter_problem(choice, tenant) else otel_exporters().get(choice)
    return default_endpoint()


@lru_cache(maxsize=8)
def _exporter(endpoint: str, named: bool):
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter

    # a named exporter takes no headers from the default's settings: they may hold its credentials
    return OTLPLogExporter(endpoint=endpoint, headers={} if named else None)


@lru_cache(maxsize=1)
def _resource():
    from opentelemetry.sdk.resources import Resource

    return Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or "evalq"})


def _record(ev: Evaluation, job_id: str, entry_key: str, now: int):
    from opentelemetry._logs import LogRecord, SeverityNumber
    from opentelemetry.sdk._logs import ReadableLogRecord
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context

    context = None
    if ev.trace_id and ev.span_id:
        context = set_span_in_context(NonRecordingSpan(SpanContext(
            int(ev.trace_id, 16), int(ev.span_id, 16), is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))))
    record = LogRecord(timestamp=now, observed_timestamp=now, context=context, event_name=EVENT_NAME,
                       severity_number=SeverityNumber.INFO, attributes=ev.attributes(job_id, entry_key))
    return ReadableLogRecord(log_record=record, resource=_resource(),
                             instrumentation_scope=InstrumentationScope("evalq"))


def export_items(r: redis.Redis, job_id: str, spec: dict, entry_key: str, entry: dict, kind: str,
                 items: list[tuple[int, dict]], force: bool = False) -> int:
    """Send the events of ``items`` (position, record) not sent before, each parented to the span a
    trace instance's record names (its ``otel``); returns how many events were sent. Never raises
    for the exporter's sake: the items are kept."""
    choice = spec.get("otel_export")
    endpoint = endpoint_for(spec)
    if endpoint is None or not items or (not force and time.monotonic() < _DOWN.get(endpoint, 0.0)):
        return 0  # none, nothing, or a collector that just failed: the final callback sends these
    if r.hexists(keys.sink(job_id, SINK), "cannot"):
        return 0  # it said it can take none: not asked again
    done = r.smismember(keys.exported(job_id, entry_key), [str(p) for p, _ in items])
    todo = [(p, rec) for (p, rec), sent in zip(items, done) if not sent]
    if not todo:
        return 0
    from opentelemetry.sdk._logs.export import LogRecordExportResult

    name = entry.get("name") or entry["id"]
    now = time.time_ns()
    exporter = _exporter(endpoint, isinstance(choice, str))
    _listen()
    sent = 0
    for lo in range(0, len(todo), BATCH):
        part = todo[lo:lo + BATCH]
        events = [(p, ev) for p, rec in part
                  for ev in evaluations(job_id, entry_key, name, kind, entry.get("parameters"), p, rec, rec.get("otel"))]
        if events:
            _ANSWER.text = None
            try:
                result = exporter.export([_record(ev, job_id, entry_key, now) for _, ev in events])
            except Exception as exc:  # the exporter's own failure: the items stay unmarked
                result = exc
            if result != LogRecordExportResult.SUCCESS:
                answer, cannot = _refusal(result)
                log.warning("job %s %s: the collector did not take %d evaluation events (%s); %s", job_id,
                            entry_key, len(events), answer, "it takes none: not asked again for the job" if cannot
                            else f"this process sends none to it for {PAUSE:.0f} s")
                _DOWN[endpoint] = time.monotonic() + PAUSE
                pipe = r.pipeline(transaction=False)
                pipe.hincrby(keys.sink(job_id, SINK), "refused", len(events))
                pipe.hset(keys.sink(job_id, SINK), mapping={"answer": answer[:500], **({"cannot": 1} if cannot else {})})
                pipe.expire(keys.sink(job_id, SINK), spec.get("ttl") or 7 * 24 * 3600)
                pipe.execute()
                telemetry.scores_exported(SINK, "refused", len(events))
                return sent
            sent += len(events)
            telemetry.scores_exported(SINK, "sent", len(events))
        pipe = r.pipeline(transaction=False)
        pipe.sadd(keys.exported(job_id, entry_key), *(str(p) for p, _ in part))
        pipe.expire(keys.exported(job_id, entry_key), spec.get("ttl") or 7 * 24 * 3600)
        pipe.execute()
    return sent


def export_rest(r: redis.Redis, job_id: str, spec: dict) -> dict | None:
    """At the job's end (the final callback): send what no chunk could (a collector that was down,
    an exporter that failed), entry by entry, a thousand items at a time, unless the collector said
    it takes none. Returns what the sink got, for run.json and results.json: per entry the items
    whose events it took (``sent``) and those it did not (``unsent``), the events it refused and its
    last answer; None when the job's scores go to no collector."""
    from evalq.shared.cluster.spec import METRICS_STAGE, stage_runs
    from evalq.shared.core.config import safe_url
    from evalq.shared.metrics.registry import REGISTRY

    endpoint = endpoint_for(spec)
    if endpoint is None:
        return None
    failures, entries = 0, {}
    for key, entry in stage_runs(spec, METRICS_STAGE):
        if entry["id"] not in REGISTRY:
            continue
        marked = {int(p) for p in r.smembers(keys.exported(job_id, key))}
        left = (item for item in stored_records.scan(r, spec, job_id, key) if item[0] not in marked)
        while not r.hexists(keys.sink(job_id, SINK), "cannot"):
            batch = list(itertools.islice(left, 1000))  # a thousand records at a time, whatever N is
            if not batch:
                break
            items = [(p, json.loads(raw)) for p, raw in batch]
            while failures < RETRIES:  # the last chance: a few tries, then the rest is logged as unsent
                before = _DOWN.get(endpoint, 0.0)
                export_items(r, job_id, spec, key, entry, REGISTRY.get(entry["id"]).aggregation, items, force=True)
                if _DOWN.get(endpoint, 0.0) == before or r.hexists(keys.sink(job_id, SINK), "cannot"):
                    break
                failures += 1
                time.sleep(min(2.0 ** failures, 8.0))
        sent = r.scard(keys.exported(job_id, key))
        entries[key] = {"sent": sent, "unsent": max(0, stored_records.count(r, job_id, key) - sent)}
        if entries[key]["unsent"]:
            log.warning("job %s %s: %d items' evaluation events were not sent (the collector did not take them)",
                        job_id, key, entries[key]["unsent"])
    said = r.hgetall(keys.sink(job_id, SINK))
    return {"endpoint": safe_url(endpoint), "entries": entries, "refused_events": int(said.get(b"refused", 0)),
            "answer": said[b"answer"].decode() if b"answer" in said else None}


def with_exports(summary: list[dict], runs: list, sink: dict | None) -> None:
    """Each entry of results.json with what the sink got of it (``exports.otlp``: sent, unsent, and
    the collector's answer where something was not sent)."""
    if sink is None:
        return
    for result, (key, _) in zip(summary, runs):
        got = sink["entries"].get(key)
        if got is not None:
            result["exports"] = {SINK: {"endpoint": sink["endpoint"], **got,
                                        **({"answer": sink["answer"]} if got["unsent"] and sink["answer"] else {})}}


def exports_total(summary: list[dict]) -> dict | None:
    """run.json's ``exports``: the sink's items sent and unsent over the job's entries."""
    got = [m["exports"][SINK] for m in summary if SINK in (m.get("exports") or {})]
    if not got:
        return None
    answer = next((g["answer"] for g in got if g.get("answer")), None)
    return {SINK: {"endpoint": got[0]["endpoint"], "sent": sum(g["sent"] for g in got),
                   "unsent": sum(g["unsent"] for g in got), **({"answer": answer} if answer else {})}}
