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
batches once its records are written, each parented to the span it judges, kept as every sink's
writes are (``evalq.results.sinks.keeping``: marked once accepted, a collector that fails left alone
a while and tried again by the final callback, one that answers 404/405 never asked again). Every
event carries ``evalq.event.id``, the same on any resend.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from functools import lru_cache
from typing import Any

from evalq.results.sinks.keeping import Refused, Sink
from evalq.shared.core.config import exporter_problem, otel_exporters, safe_url
from evalq.shared.job.stored import StoredJob, as_stored
from evalq.shared.traces.events import EVENT_NAME, Evaluation

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


def endpoint_for(spec: "StoredJob | dict") -> str | None:
    """Where a job's events go: its ``output.otel`` among what the operator configured for its tenant."""
    job = as_stored(spec)
    choice = job.otel_export  # the job's output.otel: None, False or an exporter's name
    if choice is False:
        return None
    if isinstance(choice, str):
        return None if exporter_problem(choice, job.tenant) else otel_exporters().get(choice)
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


class OtlpSink(Sink):
    """The job's OTLP/HTTP logs endpoint: every item's scores as ``gen_ai.evaluation.result`` events."""

    def __init__(self, url: str, named: bool):
        super().__init__(name=SINK, kind="otlp", endpoint=safe_url(url))
        self.url, self.named = url, named

    def send(self, job_id: str, entry_key: str, entry: dict, events: list[tuple[int, Evaluation]]) -> dict[int, str]:
        from opentelemetry.sdk._logs.export import LogRecordExportResult

        exporter = _exporter(self.url, self.named)
        _listen()
        now = time.time_ns()
        _ANSWER.text = None
        result = exporter.export([_record(ev, job_id, entry_key, now) for _, ev in events])
        if result != LogRecordExportResult.SUCCESS:
            answer, cannot = _refusal(result)
            # no HTTP status heard: the exporter could not reach the collector
            raise Refused(answer, cannot, unreachable=re.search(r"code: \d+", answer) is None)
        return {}


def sink_for(spec: "StoredJob | dict") -> OtlpSink | None:
    """The job's OTLP sink, or None when its scores go to no collector."""
    url = endpoint_for(spec)
    return None if url is None else OtlpSink(url, isinstance(as_stored(spec).otel_export, str))
