"""OTLP JSON trace exports, read as spans.

What an OpenTelemetry Collector's ``file`` and ``awss3`` exporters (and the SDK's JSON file
exporter) write: one ``ExportTraceServiceRequest`` per line, ``{"resourceSpans": [{"resource":
{"attributes": [...]}, "scopeSpans": [{"scope": {...}, "spans": [...]}]}]}``, often gzipped and
partitioned by time. Attributes are OTLP ``AnyValue`` objects (``stringValue``, ``intValue``,
``doubleValue``, ``boolValue``, ``arrayValue``, ``kvlistValue``, ``bytesValue``); trace and span
ids are hex as OTLP/JSON says (base64, protobuf's own JSON mapping of bytes, is read too).

A ``Span`` is the flat view the GenAI readers need: ids, name, times, the resource's service, the
attributes and events as plain Python values, and where it was read (file, line, place in the
request), so that a malformed one is located, never silently dropped.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any, Iterator

from evalq.shared.core.errors import kind as _kind


class SpanError(ValueError):
    """A span (or export request) that cannot be read; the message says where and why."""


@dataclass
class Span:
    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    start: int                      # nanoseconds since the epoch
    end: int
    service: str | None
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    where: str = ""                 # file line N, resourceSpans[i].scopeSpans[j].spans[k]

    def get(self, key: str, default: Any = None) -> Any:
        return self.attributes.get(key, default)


def any_value(value: Any, where: str) -> Any:
    """An OTLP ``AnyValue`` (JSON) as a Python value."""
    if not isinstance(value, dict):
        raise SpanError(f"{where}: expected an AnyValue object, got {_kind(value)}")
    if not value:
        return None
    (kind, inner), = list(value.items())[:1]
    if kind == "stringValue":
        return inner
    if kind == "boolValue":
        return bool(inner)
    if kind == "intValue":
        try:
            return int(inner)
        except (TypeError, ValueError):
            raise SpanError(f"{where}: intValue {inner!r} is not an integer") from None
    if kind == "doubleValue":
        try:
            return float(inner)
        except (TypeError, ValueError):
            raise SpanError(f"{where}: doubleValue {inner!r} is not a number") from None
    if kind == "arrayValue":
        return [any_value(v, f"{where}[{i}]") for i, v in enumerate((inner or {}).get("values") or [])]
    if kind == "kvlistValue":
        return attributes((inner or {}).get("values") or [], where)
    if kind == "bytesValue":
        return inner
    raise SpanError(f"{where}: unknown AnyValue kind {kind!r}")


def attributes(raw: Any, where: str) -> dict[str, Any]:
    """A list of OTLP ``KeyValue`` as a dict."""
    if not isinstance(raw, list):
        raise SpanError(f"{where}: attributes must be a list of {{key, value}}, got {_kind(raw)}")
    out: dict[str, Any] = {}
    for i, kv in enumerate(raw):
        if not isinstance(kv, dict) or not isinstance(kv.get("key"), str):
            raise SpanError(f"{where}[{i}]: expected {{\"key\": ..., \"value\": {{...}}}}")
        out[kv["key"]] = any_value(kv.get("value") or {}, f"{where}[{i}] ({kv['key']})")
    return out


def _id(raw: Any, size: int, what: str, where: str, optional: bool = False) -> str | None:
    """A trace (16 bytes) or span (8 bytes) id as lower-case hex."""
    if raw in (None, "") and optional:
        return None
    if isinstance(raw, str):
        if len(raw) == 2 * size:
            try:
                bytes.fromhex(raw)
                return raw.lower()
            except ValueError:
                pass
        try:
            decoded = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            decoded = b""
        if len(decoded) == size:
            return decoded.hex()
    raise SpanError(f"{where}: {what} must be {2 * size} hex digits, got {raw!r}")


def _nanos(raw: Any, what: str, where: str) -> int:
    try:
        return int(raw or 0)
    except (TypeError, ValueError):
        raise SpanError(f"{where}: {what} must be nanoseconds since the epoch, got {raw!r}") from None


def spans_of(request: Any, where: str) -> Iterator[Span | SpanError]:
    """Every span of one export request, in order; a span that cannot be read comes as a
    ``SpanError`` in its place (the others are still read)."""
    if not isinstance(request, dict) or not isinstance(request.get("resourceSpans", []), list):
        yield SpanError(f"{where}: expected an OTLP trace export ({{\"resourceSpans\": [...]}}), "
                        f"got {_kind(request)}")
        return
    for i, rs in enumerate(request.get("resourceSpans") or []):
        at = f"{where} resourceSpans[{i}]"
        try:
            resource = attributes(((rs or {}).get("resource") or {}).get("attributes") or [], f"{at}.resource")
        except SpanError as exc:
            yield exc
            continue
        service = resource.get("service.name")
        for j, ss in enumerate((rs or {}).get("scopeSpans") or (rs or {}).get("instrumentationLibrarySpans") or []):
            for k, raw in enumerate((ss or {}).get("spans") or []):
                place = f"{at}.scopeSpans[{j}].spans[{k}]"
                try:
                    yield _span(raw, service if isinstance(service, str) else None, place)
                except SpanError as exc:
                    yield exc


def _span(raw: Any, service: str | None, where: str) -> Span:
    if not isinstance(raw, dict):
        raise SpanError(f"{where}: expected a span object, got {_kind(raw)}")
    name = raw.get("name")
    trace_id = _id(raw.get("traceId"), 16, "traceId", where)
    span_id = _id(raw.get("spanId"), 8, "spanId", where)
    where = f"{where} (span {span_id}{f' {name!r}' if isinstance(name, str) else ''})"
    events = []
    for e, ev in enumerate(raw.get("events") or []):
        if not isinstance(ev, dict):
            raise SpanError(f"{where}: events[{e}] must be an object")
        events.append((str(ev.get("name") or ""), attributes(ev.get("attributes") or [], f"{where} events[{e}]")))
    return Span(trace_id=trace_id, span_id=span_id,
                parent_id=_id(raw.get("parentSpanId"), 8, "parentSpanId", where, optional=True),
                name=name if isinstance(name, str) else "",
                start=_nanos(raw.get("startTimeUnixNano"), "startTimeUnixNano", where),
                end=_nanos(raw.get("endTimeUnixNano"), "endTimeUnixNano", where),
                service=service, attributes=attributes(raw.get("attributes") or [], f"{where} attributes"),
                events=events, where=where)


def read_request(text: str, where: str) -> Any:
    """One line of an export file as JSON (a ``SpanError`` saying where when it is not)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpanError(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from None
