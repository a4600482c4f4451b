"""Settings of the providers' Batch API as a judge path (issue #24): the judging mode,
the deadline of ``auto``, and what a deployment declares about its batch capacity.

``judging.mode`` (and a judge metric entry's ``mode`` parameter, which wins):
``sync`` (default) sends every call at once; ``batch`` sends them through the Batch
API of the judge's batch-capable deployments; ``auto`` sends them as batches and,
by ``judging.deadline``, what has not come back synchronously. A deadline is a
duration from the job's submission (``"6h"``, ``"90m"``, ``"3600s"``, ``"1h30m"``)
or a clock time in UTC (``"06:30"``: its next occurrence after submission); ``auto``
without one uses ``DEFAULT_AUTO_DEADLINE`` (6 h).
"""

from __future__ import annotations

import re
from datetime import datetime, time, timedelta, timezone
from typing import Annotated, Literal

from pydantic import Field, PlainSerializer, PlainValidator, WithJsonSchema

from evalq.shared.core import bounds
from evalq.shared.core.strict import Strict

JudgingMode = Literal["sync", "batch", "auto"]
MODES = ("sync", "batch", "auto")
BATCHED = ("batch", "auto")  # modes that need a batch-capable deployment
MAX_DEADLINE = timedelta(days=7)
_DURATION = re.compile(r"^(?:(?P<h>\d{1,4})h)?(?:(?P<m>\d{1,6})m)?(?:(?P<s>\d{1,8})s)?$")
_CLOCK = re.compile(r"^(?P<h>[01]\d|2[0-3]):(?P<m>[0-5]\d)$")


class Deadline:
    """``judging.deadline``, read: either a duration after submission or a UTC clock time."""

    __slots__ = ("text", "duration", "clock")

    def __init__(self, text: str, duration: timedelta | None = None, clock: time | None = None):
        if (duration is None) == (clock is None):
            raise ValueError("a deadline is a duration or a clock time")
        self.text, self.duration, self.clock = text, duration, clock

    def __repr__(self) -> str:
        return f"Deadline({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Deadline) and (self.duration, self.clock) == (other.duration, other.clock)

    def __hash__(self) -> int:
        return hash((self.duration, self.clock))

    def at(self, submitted_at: datetime) -> datetime:
        """When the deadline falls for a job submitted at ``submitted_at`` (a naive
        time is read as UTC); a clock time is its next occurrence strictly after it."""
        start = submitted_at.replace(tzinfo=timezone.utc) if submitted_at.tzinfo is None \
            else submitted_at.astimezone(timezone.utc)
        if self.duration is not None:
            return start + self.duration
        moment = start.replace(hour=self.clock.hour, minute=self.clock.minute, second=0, microsecond=0)
        return moment if moment > start else moment + timedelta(days=1)


def parse_deadline(value: object) -> Deadline:
    """``"6h"``, ``"90m"``, ``"3600s"``, ``"1h30m"`` (a duration, more than 0 and at most
    7 days) or ``"HH:MM"`` (UTC); ValueError saying what is accepted otherwise."""
    if isinstance(value, Deadline):
        return value
    if not isinstance(value, str):
        raise ValueError(f"expected a string such as \"6h\", \"90m\" or \"06:30\", got {type(value).__name__}")
    text = value.strip()
    clock = _CLOCK.match(text)
    if clock:
        return Deadline(text, clock=time(int(clock["h"]), int(clock["m"])))
    duration = _DURATION.match(text.lower())
    if not text or not duration:
        raise ValueError(f"{value!r} is neither a duration (\"6h\", \"90m\", \"3600s\", \"1h30m\") nor a UTC "
                         "clock time (\"06:30\")")
    span = timedelta(hours=int(duration["h"] or 0), minutes=int(duration["m"] or 0),
                     seconds=int(duration["s"] or 0))
    if span <= timedelta(0):
        raise ValueError(f"{value!r}: a deadline must lie after the submission")
    if span > MAX_DEADLINE:
        raise ValueError(f"{value!r}: at most 7 days after the submission (a batch's window is 24 h)")
    return Deadline(text, duration=span)


DEFAULT_AUTO_DEADLINE = parse_deadline("6h")

# how a job file writes it, and how a stored spec carries it (the text as given)
DeadlineField = Annotated[Deadline, PlainValidator(parse_deadline), PlainSerializer(lambda d: d.text, return_type=str),
                          WithJsonSchema({"type": "string", "examples": ["6h", "90m", "06:30"]})]


class BatchCapacity(Strict):
    """A deployment's Batch API: its enqueued-token quota (Azure's enqueued-token
    limit of a global-batch deployment; OpenAI's batch queue limit), shared by all
    jobs, and on Azure the global-batch deployment that answers (default: the
    deployment's own)."""

    enqueued_tokens: int = Field(gt=0, le=bounds.MAX_ENQUEUED_TOKENS, strict=True,
                                 description="estimated tokens its unfinished batches may hold at once")
    deployment: str | None = Field(default=None, min_length=1, max_length=256,
                                   description="Azure: the global-batch deployment name (default: 'deployment')")
    completion_window: Literal["24h"] = Field(default="24h", description="the providers' only window: 24h")
