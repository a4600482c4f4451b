"""Aggregation of per-item results, chosen by the registry entry's ``aggregation``.

Streaming: an aggregator sees one item at a time, so a million-item metric
aggregates in flat memory. Mergeable aggregators (mean, rating) also work in
parts: each chunk's worker aggregates its own items (``chunk_part``) and the
job's callback merges one small part per chunk (``merge_parts``) instead of
reading every item again.
"""

from __future__ import annotations

import math
from array import array
from typing import Any, Iterable

Number = (int, float)


class MeanAggregator:
    """Mean of a number per item, or of each number for items that are objects."""

    mergeable = True

    def __init__(self, params: dict | None = None) -> None:
        self.params = params or {}
        self.n = 0
        self.n_errors = 0
        self.n_skipped = 0
        self._sum: dict[str, float] = {}
        self._count: dict[str, int] = {}
        self._scalar = True

    def add(self, record: dict[str, Any]) -> None:
        if record.get("error") is not None:
            self.n_errors += 1
            return
        if record.get("skipped") is not None:
            self.n_skipped += 1
            return
        value = record["result"]
        self.n += 1
        if isinstance(value, dict):
            self._scalar = False
            items = value.items()
        else:
            items = (("", value),)
        for key, v in items:
            if isinstance(v, Number) and not isinstance(v, bool):
                self._sum[key] = self._sum.get(key, 0.0) + v
                self._count[key] = self._count.get(key, 0) + 1

    def state(self) -> dict[str, Any]:
        return {"n": self.n, "n_errors": self.n_errors, "n_skipped": self.n_skipped, "sum": self._sum,
                "count": self._count, "scalar": self._scalar}

    def merge(self, state: dict[str, Any]) -> None:
        self.n += state["n"]
        self.n_errors += state["n_errors"]
        self.n_skipped += state["n_skipped"]
        for key, value in state["sum"].items():
            self._sum[key] = self._sum.get(key, 0.0) + value
            self._count[key] = self._count.get(key, 0) + state["count"][key]
        self._scalar = self._scalar and state["scalar"]

    def score(self) -> float | dict[str, float] | None:
        if self.n == 0:
            return None
        means = {k: self._sum[k] / self._count[k] for k in self._sum}
        if self._scalar:
            return means.get("")
        return means


class DistributionAggregator(MeanAggregator):
    """The means, plus each number's distribution under ``"distribution"``.

    A list of numbers (one per layer, say) is taken position by position. The
    values are kept (8 bytes each) so quantiles are exact.
    """

    mergeable = False  # quantiles need every value: the callback reads the items
    QUANTILES = {"p5": 0.05, "p25": 0.25, "median": 0.5, "p75": 0.75, "p95": 0.95}
    BINS = 10

    def __init__(self, params: dict | None = None) -> None:
        super().__init__(params)
        self._values: dict[str, list[array]] = {}
        self._is_list: dict[str, bool] = {}

    def add(self, record: dict[str, Any]) -> None:
        super().add(record)
        if record.get("error") is not None or record.get("skipped") is not None:
            return
        value = record["result"]
        for key, v in (value.items() if isinstance(value, dict) else (("", value),)):
            series = v if isinstance(v, list) else [v]
            self._is_list[key] = isinstance(v, list)
            columns = self._values.setdefault(key, [])
            for i, x in enumerate(series):
                if isinstance(x, Number) and not isinstance(x, bool):
                    while len(columns) <= i:
                        columns.append(array("d"))
                    columns[i].append(x)

    def score(self) -> dict[str, Any] | None:
        if self.n == 0:
            return None
        means: dict[str, Any] = {}
        spread: dict[str, Any] = {}
        for key, columns in self._values.items():
            stats = [_describe(sorted(c), self.QUANTILES, self.BINS) for c in columns]
            avgs = [sum(c) / len(c) if c else None for c in columns]
            if self._is_list[key]:
                means[key], spread[key] = avgs, stats
            elif columns:
                means[key], spread[key] = avgs[0], stats[0]
        if self._scalar:
            return {"mean": means.get(""), "distribution": spread.get("")}
        return {**means, "distribution": spread}


def _describe(values: list[float], quantiles: dict[str, float], bins: int) -> dict[str, Any] | None:
    """Standard deviation, min, quantiles (linear interpolation), max and a histogram
    whose range is [min, max] widened to tenths."""
    n = len(values)
    if n == 0:
        return None
    mean = sum(values) / n
    out: dict[str, Any] = {"std": math.sqrt(sum((v - mean) ** 2 for v in values) / n), "min": values[0]}
    for name, q in quantiles.items():
        pos = q * (n - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, n - 1)
        out[name] = values[lo] + (values[hi] - values[lo]) * (pos - lo)
    out["max"] = values[-1]
    # rounded first: float32 scores of identical texts come out as 1.0000001
    low = math.floor(round(values[0] * 10, 4)) / 10
    high = math.ceil(round(values[-1] * 10, 4)) / 10
    if high <= low:
        high = low + 0.1
    width = (high - low) / bins
    counts = [0] * bins
    for v in values:
        counts[min(int((v - low) / width), bins - 1)] += 1
    out["histogram"] = {"edges": [round(low + i * width, 6) for i in range(bins + 1)], "counts": counts}
    return out


class RatingAggregator(MeanAggregator):
    """Integer ratings ``{"score": k, "reason": ...}``: the mean, the count of
    each point of the scale and, with a ``threshold`` parameter, the pass rate
    (share of rated items scoring at least the threshold)."""

    def __init__(self, params: dict | None = None) -> None:
        super().__init__(params)
        lo, hi = self.params.get("scale_min", 1), self.params.get("scale_max", 5)
        self.counts = {k: 0 for k in range(lo, hi + 1)}

    def add(self, record: dict[str, Any]) -> None:
        super().add(record)
        if "result" in record and record.get("error") is None:
            score = record["result"]["score"]
            self.counts[score] = self.counts.get(score, 0) + 1

    def state(self) -> dict[str, Any]:
        return {**super().state(), "counts": {str(k): c for k, c in self.counts.items() if c}}

    def merge(self, state: dict[str, Any]) -> None:
        super().merge(state)
        for k, c in state["counts"].items():
            self.counts[int(k)] = self.counts.get(int(k), 0) + c

    def score(self) -> dict[str, Any] | None:
        if self.n == 0:
            return None
        out: dict[str, Any] = {"mean": sum(k * c for k, c in self.counts.items()) / self.n,
                               "distribution": {str(k): c for k, c in sorted(self.counts.items())}}
        threshold = self.params.get("threshold")
        if threshold is not None:
            out["pass_rate"] = sum(c for k, c in self.counts.items() if k >= threshold) / self.n
        return out


AGGREGATORS = {"mean": MeanAggregator, "distribution": DistributionAggregator, "rating": RatingAggregator}


def aggregator_for(kind: str, params: dict | None = None):
    return AGGREGATORS[kind](params)


def chunk_part(kind: str, params: dict, records: list[dict]) -> dict | None:
    """One chunk's items aggregated, overall and per category (None when the
    aggregation cannot be merged)."""
    if not AGGREGATORS[kind].mergeable:
        return None
    overall, by_category = aggregator_for(kind, params), {}
    for record in records:
        overall.add(record)
        category = record.get("category")
        if category is not None:
            by_category.setdefault(category, aggregator_for(kind, params)).add(record)
    return {"n_items": len(records), "all": overall.state(),
            "categories": {c: agg.state() for c, agg in by_category.items()}}


def merge_parts(kind: str, params: dict, parts: Iterable[dict]):
    """(overall aggregator, {category: aggregator}, items covered) from chunk parts."""
    overall, by_category, covered = aggregator_for(kind, params), {}, 0
    for part in parts:
        covered += part["n_items"]
        overall.merge(part["all"])
        for category, state in part["categories"].items():
            by_category.setdefault(category, aggregator_for(kind, params)).merge(state)
    return overall, by_category, covered
