"""Aggregation of per-item results, chosen by the registry entry's ``aggregation``.

Streaming: an aggregator sees one item at a time, so a million-item metric
aggregates in flat memory.
"""

from __future__ import annotations

from typing import Any

Number = (int, float)


class MeanAggregator:
    """Mean of a number per item, or of each number for items that are objects."""

    def __init__(self) -> None:
        self.n = 0
        self.n_errors = 0
        self._sum: dict[str, float] = {}
        self._count: dict[str, int] = {}
        self._scalar = True

    def add(self, record: dict[str, Any]) -> None:
        if record.get("error") is not None:
            self.n_errors += 1
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

    def score(self) -> float | dict[str, float] | None:
        if self.n == 0:
            return None
        means = {k: self._sum[k] / self._count[k] for k in self._sum}
        if self._scalar:
            return means.get("")
        return means


AGGREGATORS = {"mean": MeanAggregator}


def aggregator_for(kind: str):
    return AGGREGATORS[kind]()
