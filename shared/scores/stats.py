"""Intervals and tests for reports and comparisons. Pure functions, no numpy.

- ``wilson``: the Wilson score interval of a proportion (defect and pass rates);
- ``mean_interval``: mean +- 1.96 standard errors from mergeable moments
  (count, sum, sum of squares), what the final callback can afford for a
  million items;
- ``score_interval``: a metric's interval from those moments: Wilson when every
  value is 0 or 1, else the normal one clipped to the metric's range;
- ``bootstrap_mean``: a percentile bootstrap interval of a mean over instances;
- ``paired``: for two runs' values on the same instances, the mean difference,
  a paired-bootstrap 95% interval, and a two-sided paired permutation test
  (random sign flips of the differences) p-value.
All random draws come from ``random.Random(seed)``: the same inputs give the
same numbers.
"""

from __future__ import annotations

import math
import random
from typing import Mapping, Sequence, Tuple, Union

Z95 = 1.959963984540054
SEED = 20261123
RESAMPLES = 2000


# A series' per-instance values: columns (instance ids, values), or a mapping id -> value
Items = Union[Tuple[Sequence[str], Sequence[float]], Mapping[str, float]]


def columns(items: Items) -> tuple[Sequence[str], Sequence[float]]:
    """``items`` as columns (instance ids, values in the same order)."""
    if isinstance(items, Mapping):
        return list(items), list(items.values())
    return items


def wilson(k: int, n: int, z: float = Z95) -> list[float] | None:
    if n == 0:
        return None
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return [max(0.0, centre - half), min(1.0, centre + half)]


def mean_interval(n: int, total: float, total_sq: float, z: float = Z95) -> list[float] | None:
    """Normal approximation: mean +- z * s / sqrt(n) (sample standard deviation)."""
    if n < 2:
        return None
    mean = total / n
    var = max(0.0, (total_sq - n * mean * mean) / (n - 1))
    half = z * math.sqrt(var / n)
    return [mean - half, mean + half]


def score_interval(n: int, total: float, total_sq: float, binary: bool,
                   bounds: tuple[float, float] | None = None) -> list[float] | None:
    """The 95% interval of a mean that never leaves the values the metric can take:
    Wilson when every value is 0 or 1 (``total`` is then the count of ones), else the
    normal interval clipped to ``bounds`` (the metric's range, when it has one)."""
    ci = wilson(round(total), n) if binary else mean_interval(n, total, total_sq)
    if ci is None or bounds is None:
        return ci
    lo, hi = bounds
    return [min(max(ci[0], lo), hi), max(min(ci[1], hi), lo)]


def _percentiles(values: list[float], lo: float = 0.025, hi: float = 0.975) -> list[float]:
    values = sorted(values)
    def at(q: float) -> float:
        pos = q * (len(values) - 1)
        i = math.floor(pos)
        j = min(i + 1, len(values) - 1)
        return values[i] + (values[j] - values[i]) * (pos - i)
    return [at(lo), at(hi)]


def bootstrap_mean(values: Sequence[float], seed: int = SEED, resamples: int = RESAMPLES) -> list[float] | None:
    n = len(values)
    if n < 2:
        return None
    rng = random.Random(seed)
    means = [sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples)]
    return _percentiles(means)


def paired(base: Sequence[float], new: Sequence[float], seed: int = SEED,
           resamples: int = RESAMPLES) -> dict:
    """``new - base`` over paired instances: mean difference, paired-bootstrap 95%
    interval, and the two-sided p-value of a paired permutation (sign-flip) test."""
    diffs = [b - a for a, b in zip(base, new)]
    n = len(diffs)
    if n == 0:
        return {"n": 0, "diff": None, "ci95": None, "p_value": None}
    mean = sum(diffs) / n
    rng = random.Random(seed)
    boots = [sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples)] if n > 1 else [mean]
    observed = abs(mean)
    nonzero = [d for d in diffs if d != 0]
    if not nonzero:
        p = 1.0
    else:
        extreme = 0
        for _ in range(resamples):
            flipped = sum(d if rng.random() < 0.5 else -d for d in nonzero) / n
            extreme += abs(flipped) >= observed - 1e-12
        p = (extreme + 1) / (resamples + 1)
    return {"n": n, "diff": mean, "ci95": _percentiles(boots) if n > 1 else None, "p_value": p}
