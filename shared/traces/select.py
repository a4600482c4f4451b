"""Which GenAI spans of a trace dataset are scored: filters, and a sample decided by the trace id.

``dataset.traces`` of a job (all optional):

- ``sample_rate`` (0 to 1, default 1): the share of traces scored, decided by the trace id alone
  with OpenTelemetry's ``TraceIdRatioBased`` rule (the trace id's lower 64 bits below
  ``rate x 2^64``): the same trace is in or out of every run with that rate, whichever files it is
  read from, and the sample of a higher rate holds the sample of a lower one. The turns of a
  conversation (``gen_ai.conversation.id``) are decided by the conversation's id (its SHA-256's
  first 128 bits, read as a trace id), so a conversation is sampled whole.
- ``services``, ``span_names``, ``models``: lists of names or globs (``checkout-*``); a span is kept
  when it matches one of each list given. ``models`` and ``span_names`` apply to the model calls
  and agent spans (a tool span goes with its run).
- ``since``, ``until``: the span's start time, ISO 8601 (``2026-11-25T00:00:00Z``) or relative to
  the submission (``-24h``, ``-1d``, ``-30m``); ``until`` is excluded.
- ``attributes``: ``{"deployment.environment": "prod"}``: each named span attribute equals the value.
- ``unit``: ``auto`` (agent runs and conversations grouped) or ``span`` (every chat span alone).
- ``once`` (default true): a span an earlier run of the job's suite took is left out
  (``evalq.orchestrator.once``): nightly runs over overlapping windows score each span once.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from datetime import datetime, timedelta, timezone
from typing import Literal

from pydantic import Field, field_validator

from evalq.shared.core.strict import Strict
from evalq.shared.traces.genai import conversation, model
from evalq.shared.traces.otlp import Span

ID_LIMIT = (1 << 64) - 1
_RELATIVE = re.compile(r"^-(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def sampled(trace_id: str, rate: float) -> bool:
    """OpenTelemetry's ``TraceIdRatioBased`` decision for a hex trace id."""
    return (int(trace_id, 16) & ID_LIMIT) < round(rate * (ID_LIMIT + 1))


class TraceSelection(Strict):
    sample_rate: float = Field(default=1.0, ge=0, le=1, description="share of traces scored, by trace id "
                               "(OpenTelemetry's TraceIdRatioBased rule: the same traces in every run)")
    services: list[str] | None = Field(default=None, description="service.name values or globs")
    span_names: list[str] | None = Field(default=None, description="span names or globs (model calls, agents)")
    models: list[str] | None = Field(default=None, description="model names or globs (model calls, agents)")
    since: datetime | None = Field(default=None, description="spans that started at or after: ISO 8601, or "
                                   "relative to submission (-24h)")
    until: datetime | None = Field(default=None, description="spans that started before (ISO 8601 or -1h)")
    attributes: dict[str, str | int | float | bool] | None = Field(
        default=None, description="span attributes that must equal these values")
    unit: Literal["auto", "span"] = Field(default="auto", description="auto: agent runs and conversations "
                                          "grouped; span: every chat span alone")
    once: bool = Field(default=True, description="each span scored once per suite: spans an earlier run of the "
                       "job's suite took are left out (nightly runs over overlapping windows)")

    @field_validator("since", "until", mode="before")
    @classmethod
    def _relative(cls, value):
        if isinstance(value, str):
            m = _RELATIVE.match(value.strip())
            if m:
                return datetime.now(timezone.utc) - timedelta(**{_UNITS[m.group(2)]: float(m.group(1))})
        return value

    @field_validator("since", "until")
    @classmethod
    def _aware(cls, value):
        if value is not None and value.tzinfo is None:
            raise ValueError("give a time zone (e.g. 2026-11-25T00:00:00Z)")
        return value

    def verdict(self, span: Span, kind: str) -> str:
        """``kept``, ``filtered`` (a filter left it out) or ``sampled`` (not in the sample)."""
        if self.services is not None and not _matches(span.service, self.services):
            return "filtered"
        ns = span.start
        if self.since is not None and ns < _nanos(self.since):
            return "filtered"
        if self.until is not None and ns >= _nanos(self.until):
            return "filtered"
        if kind != "tool":
            if self.span_names is not None and not _matches(span.name, self.span_names):
                return "filtered"
            if self.models is not None:
                name = model(span)
                if not (name is None and kind == "agent") and not _matches(name, self.models):
                    return "filtered"
        if self.attributes:
            for key, want in self.attributes.items():
                if span.attributes.get(key) != want:
                    return "filtered"
        if self.sample_rate < 1 and not sampled(self.sample_key(span), self.sample_rate):
            return "sampled"
        return "kept"

    def sample_key(self, span: Span) -> str:
        """What decides a span's sample: its trace id; for a turn of a conversation (unit ``auto``)
        the conversation's id, hashed to 64 bits, so that a conversation is in or out whole."""
        conv = conversation(span) if self.unit == "auto" else None
        if conv is None:
            return span.trace_id
        return hashlib.sha256(conv.encode()).hexdigest()[:32]


def _matches(value: str | None, patterns: list[str]) -> bool:
    return value is not None and any(fnmatch.fnmatchcase(value, p) for p in patterns)


def _nanos(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000_000)
