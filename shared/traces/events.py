"""An item's result as OpenTelemetry GenAI evaluation events (``gen_ai.evaluation.result``).

The semantic conventions define the event a score goes back as: ``gen_ai.evaluation.name``,
``gen_ai.evaluation.score.value``, ``gen_ai.evaluation.score.label``,
``gen_ai.evaluation.explanation``, ``gen_ai.response.id``, parented to the span it judges (its
trace and span ids). An item of a trace dataset carries that span (``otel``); any other item has
none, and names itself by ``evalq.instance.id``. Pure: what to send, not how.

One event per number the item's result reads as (``evalq.shared.scores.results``): a one-number
metric or a rating gives one, named as the entry; an object of numbers (rouge, a trajectory) one per
field, named ``<entry>.<field>``. The label is ``pass`` / ``fail`` where the entry has a pass rule
(a rating's threshold, a defect's), a defect's severity band where it has a severity, a pairwise
comparison's ``win`` / ``tie`` / ``loss``; the
explanation is a judge's reason. An item that failed or was not applicable sends nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from evalq.shared.scores.results import read

EVENT_NAME = "gen_ai.evaluation.result"
# Azure AI's severity bands (0-7): the label of a defect metric's severity
BANDS = ((1, "very_low"), (3, "low"), (5, "medium"), (7, "high"))


@dataclass(frozen=True)
class Evaluation:
    name: str
    value: float
    label: str | None
    explanation: str | None
    trace_id: str | None      # hex, the judged span's trace
    span_id: str | None
    response_id: str | None
    instance_id: str
    event_id: str             # <job>:<entry>:<position>:<field>: the same event on every export

    def attributes(self, job_id: str, entry_key: str) -> dict[str, Any]:
        out: dict[str, Any] = {"gen_ai.evaluation.name": self.name, "gen_ai.evaluation.score.value": self.value,
                               "evalq.job.id": job_id, "evalq.entry": entry_key, "evalq.event.id": self.event_id}
        for key, value in (("gen_ai.evaluation.score.label", self.label),
                           ("gen_ai.evaluation.explanation", self.explanation),
                           ("gen_ai.response.id", self.response_id)):
            if value is not None:
                out[key] = value
        if self.span_id is None:
            out["evalq.instance.id"] = self.instance_id
        return out


def band(severity: float) -> str:
    return next((name for top, name in BANDS if severity <= top), "high")


def evaluations(job_id: str, entry_key: str, entry_name: str, kind: str, params: dict | None,
                position: int, record: dict, otel: dict | None) -> list[Evaluation]:
    """The events of one item's record (none for an error, a skip, a not-applicable item)."""
    reading = read(kind, params, record)
    if not reading.values:
        return []
    result = record.get("result")
    reason = result.get("reason") if isinstance(result, dict) and isinstance(result.get("reason"), str) else None
    label = None if reading.passes is None else ("pass" if reading.passes else "fail")
    if "severity" in reading.sample:
        label = band(reading.sample["severity"])
    if kind == "pairwise" and isinstance(result, dict) and isinstance(result.get("outcome"), str):
        label = result["outcome"]  # win, tie or loss against the baseline
    otel = otel or {}
    single = len(reading.values) == 1
    out = []
    for field, value in reading.values.items():
        value = reading.sample.get("severity", value) if kind == "defect" else value
        out.append(Evaluation(
            name=entry_name if single else f"{entry_name}.{field}", value=float(value), label=label,
            explanation=reason, trace_id=otel.get("trace_id"), span_id=otel.get("span_id"),
            response_id=otel.get("response_id"), instance_id=str(record.get("instance_id")),
            event_id=f"{job_id}:{entry_key}:{position}:{field}"))
    return out
