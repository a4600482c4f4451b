"""How an item's result reads: one module decides, by the aggregation kind recorded for
its metric entry (the registry's ``aggregation``), what a result is and what follows from
it. The aggregates (``evalq.shared.scores.aggregate``), ``evalq compare`` and the HTML report all
read results here, so a result means the same number everywhere.

Kinds:

- ``mean``: a number per item, or an object of numbers (each averaged apart). A boolean is
  0 or 1 (an item that "passes" counts 1), in results.json as in a comparison.
- ``distribution``: an object of numbers (bertscore's precision, recall, f1); lists
  (one number per layer) are not compared item by item.
- ``rating``: ``{"score": k, "reason": ...}``; with a ``threshold`` parameter an item
  passes at ``k >= threshold``.
- ``defect``: a severity ``{"severity": s}``, content_safety's ``{harm: {"severity": s}}``
  or a flag ``{"<flag>": true|false}``; an item is a defect at ``s >= threshold`` (any
  harm) or with its flag true, and passes when it is not.
- ``classification``, ``toxicity``, ``robustness`` (fmeval's): objects of numbers read as
  ``mean``'s; a toxicity item is as bad as its likeliest label, a robustness item as its
  largest measured change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Number = (int, float)


@dataclass(frozen=True)
class Reading:
    """What follows from one item's record.

    ``values``: the per-item numbers whose means results.json reports, by the names gates
    and comparisons use (``mean`` for a one-number result or a rating, ``defect_rate`` for a
    defect metric, the field names of an object). ``sample``: the numbers the report draws
    (a defect's severity rather than its 0/1). ``badness``: how bad the item is for the
    report's worst items (higher: worse; ``inf`` for an error; None: not ranked).
    ``passes``: the entry's pass rule for this item, where it has one."""

    values: dict[str, float] = field(default_factory=dict)
    sample: dict[str, float] = field(default_factory=dict)
    badness: float | None = None
    passes: bool | None = None


def read(kind: str, params: dict | None, record: dict) -> Reading:
    """The reading of an item record (``result``, or ``error``/``skipped``) of an entry
    aggregated as ``kind`` with ``params``."""
    if "result" not in record or record.get("error") is not None:
        return Reading(badness=float("inf") if record.get("error") is not None else None)
    result, params = record["result"], params or {}
    if kind == "defect":
        threshold = params.get("threshold")
        defect = is_defect(result, threshold)
        graded = severities(result)
        if graded is not None:
            sample = {"severity": float(graded[""])} if "" in graded else {}
            badness = float(max(graded.values()))
        else:
            sample, badness = {}, 1.0 if defect else 0.0
        return Reading({"defect_rate": float(defect)}, sample, badness, not defect)
    if kind == "rating":
        value = score(result)
        if value is None:
            return Reading()
        threshold = params.get("threshold")
        turns = result.get("turns") if isinstance(result, dict) else None
        lowest = min((t["score"] for t in turns if "score" in t), default=value) if isinstance(turns, list) else value
        # a conversation scored turn by turn passes when every turn does
        return Reading({"mean": value}, {"mean": value}, -value, lowest >= threshold if threshold is not None else None)
    if kind == "pairwise":  # the candidate against the baseline: a win 1, a tie 1/2, a loss 0
        value = result.get("score") if isinstance(result, dict) else None
        if not isinstance(value, (int, float)):
            return Reading()
        return Reading({"score": float(value)}, {"score": float(value)}, -float(value))
    values = mean_values(result)
    if not values:
        return Reading()
    if kind == "toxicity":  # the likeliest label is the item's badness
        return Reading(values, values, max(values.values()))
    if kind == "robustness":  # how much the answers moved: the largest change measured
        moved = [v for k, v in values.items() if k in CHANGE_FIELDS or k.startswith("delta_")]
        return Reading(values, values, max(moved) if moved else None)
    headline = values.get("mean", values.get("score", values.get("f1")))
    return Reading(values, values, -(headline if headline is not None else min(values.values())))


# semantic_robustness's fields that measure a change (higher: the model moved more)
CHANGE_FIELDS = ("word_error_rate", "bertscore_dissimilarity")

ERROR, SKIPPED, NOT_APPLICABLE, SCORED = "error", "skipped", "not_applicable", "scored"


def rating_scale(params: dict | None) -> tuple[int, int]:
    """A rated entry's scale: its ``scale_min`` and ``scale_max`` (1 to 5 by default)."""
    params = params or {}
    return params.get("scale_min", 1), params.get("scale_max", 5)


def outcome(record: dict) -> str:
    """How an item record counts: an error (``n_errors``), else a skip (``n_skipped``), else not
    applicable (``n_not_applicable``), else scored (``n``). The aggregates and the workers'
    Prometheus counters both count by it."""
    if record.get("error") is not None:
        return ERROR
    if record.get("skipped") is not None:
        return SKIPPED
    if record.get("not_applicable") is not None:
        return NOT_APPLICABLE
    return SCORED


def mean_values(result: Any) -> dict[str, float]:
    """A ``mean``/``distribution`` result's numbers: ``{"mean": x}`` for one number (a boolean
    is 0 or 1), else the object's number and boolean fields (lists are left out)."""
    if isinstance(result, Number):
        return {"mean": float(result)}
    if isinstance(result, dict):
        return {k: float(v) for k, v in result.items() if isinstance(v, Number)}
    return {}


def number(value: Any) -> float | None:
    """A value a mean counts: a number, a boolean as 0 or 1; None for anything else."""
    return float(value) if isinstance(value, Number) else None


def entry_keys(results: list[dict]) -> list[str]:
    """How comparisons and gates name results.json's entries: ``name``, else the metric id;
    a metric listed twice without names is ``id#2`` the second time."""
    keys, seen = [], {}
    for m in results:
        base = m.get("name") or m["metric"]
        seen[base] = seen.get(base, 0) + 1
        keys.append(base if seen[base] == 1 else f"{base}#{seen[base]}")
    return keys


def severities(result: Any) -> dict[str, int] | None:
    """``{"": s}`` for ``{"severity": s, ...}``, ``{harm: s, ...}`` for content_safety's
    ``{harm: {"severity": s, ...}, ...}``; None for a result without severities."""
    if not isinstance(result, dict):
        return None
    if "severity" in result:
        return {"": result["severity"]}
    graded = {k: v["severity"] for k, v in result.items() if isinstance(v, dict) and "severity" in v}
    return graded or None


def flag(result: Any) -> bool | None:
    """A flag result: the boolean itself, or a dict's first boolean field (e.g.
    ``{"protected_material": true, "reason": ...}``); None when there is none."""
    if isinstance(result, bool):
        return result
    if isinstance(result, dict):
        return next((v for v in result.values() if isinstance(v, bool)), None)
    return None


def score(result: Any) -> float | None:
    """A bare number, or a dict's numeric ``score`` field; None otherwise (booleans are flags)."""
    value = result.get("score") if isinstance(result, dict) else result
    return float(value) if isinstance(value, Number) and not isinstance(value, bool) else None


def numbers(result: Any) -> dict[str, float]:
    """A dict result's numeric (not boolean) fields, e.g. ``{"f1": ..., "precision": ...}``."""
    if not isinstance(result, dict):
        return {}
    return {k: float(v) for k, v in result.items() if isinstance(v, Number) and not isinstance(v, bool)}


def is_defect(result: Any, threshold: int | None) -> bool:
    """A defect-metric item result read as defect or not: a severity at or above
    the threshold, any harm's (content_safety), or a flag that is true."""
    graded = severities(result)
    if graded is not None:
        return threshold is not None and any(s >= threshold for s in graded.values())
    marked = flag(result)
    return marked if marked is not None else (not isinstance(result, dict) and bool(result))


def human_defect(grade: Any, threshold: int | None) -> bool:
    """A human label for a defect metric: true/false, or a severity 0-7."""
    if isinstance(grade, bool):
        return grade
    return threshold is not None and grade >= threshold
