"""Intervals and tests for reports and comparisons. Pure functions.

- ``wilson``: the Wilson score interval of a proportion (defect and pass rates);
- ``mean_interval``: mean +- 1.96 standard errors from mergeable moments
  (count, sum, sum of squares), what the final callback can afford for a
  million items;
- ``score_interval``: a metric's interval from those moments: Wilson when every
  value is 0 or 1, else the normal one clipped to the metric's range;
- ``bootstrap_mean``: a percentile bootstrap interval of a mean over instances;
- ``describe``: a distribution's spread, quantiles and histogram (bertscore's report);
- ``paired``: for two runs' values on the same instances, the mean difference,
  a paired-bootstrap 95% interval, and a two-sided paired permutation test
  (random sign flips of the differences) p-value.
All random draws are ``random.Random(seed)``'s: the same inputs give the same numbers. The
resampling is done with numpy, many resamples at a time (``_Draws`` reads Python's generator's
words from numpy's Mersenne Twister set to the same state, so the draws, and each resample's
left-to-right sum, are those of the plain Python loop it replaced, 5 to 7 times faster: the
final callback's regression check runs it per field of a job of up to 500 items, ``evalq
compare`` per field of any size).
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


# resamples drawn and summed at a time: at most this many values (32 MB an array)
_BLOCK = 4_000_000


class _Draws:
    """``random.Random(seed)``'s draws, many at a time: numpy's MT19937 set to the state
    ``random.Random(seed)`` starts from yields the same 32-bit words, read here as CPython reads
    them for ``randrange(n)`` and for ``random() < 0.5``."""

    def __init__(self, seed: int):
        import numpy as np

        state = random.Random(seed).getstate()[1]  # 624 words and a position
        self._bits = np.random.MT19937()
        self._bits.state = {"bit_generator": "MT19937",
                            "state": {"key": np.asarray(state[:-1], dtype=np.uint32), "pos": state[-1]}}
        self._words = np.zeros(0, dtype=np.uint64)  # drawn, not yet read

    def _more(self, count: int) -> None:
        import numpy as np

        self._words = np.concatenate([self._words, self._bits.random_raw(count)])

    def below(self, n: int, count: int):
        """``count`` successive ``randrange(n)`` (n < 2**32): a word's top ``n.bit_length()``
        bits, the words that give n or more skipped (CPython's ``_randbelow``)."""
        import numpy as np

        shift = np.uint64(32 - n.bit_length())
        taken_share = n / 2 ** n.bit_length()  # more than half
        parts, got = [], 0
        while got < count:
            need = count - got
            wanted = int(need / taken_share * 1.001) + 256  # almost always enough at once
            if len(self._words) < wanted:
                self._more(wanted - len(self._words))
            candidates = self._words >> shift
            taken = np.flatnonzero(candidates < n)
            if len(taken) >= need:
                parts.append(candidates[taken[:need]])
                self._words = self._words[taken[need - 1] + 1:]
                got = count
            else:
                parts.append(candidates[taken])
                self._words = self._words[:0]
                got += len(taken)
        return np.concatenate(parts).astype(np.intp) if parts else np.zeros(0, dtype=np.intp)

    def heads(self, count: int):
        """``count`` successive ``random() < 0.5``: ``random()`` reads two words, and is below
        one half exactly when the first is below 2**31."""
        if len(self._words) < 2 * count:
            self._more(2 * count - len(self._words))
        words, self._words = self._words[:2 * count], self._words[2 * count:]
        return words[0::2] < 2 ** 31


def _row_sums(rows):
    """Each row summed left to right, as the Python loop summed each resample."""
    import numpy as np

    return np.cumsum(rows, axis=1)[:, -1]


def _resampled_means(values, draws: _Draws, resamples: int):
    """The means of ``resamples`` bootstrap resamples of ``values`` (a float array)."""
    import numpy as np

    n = len(values)
    means = np.empty(resamples)
    step = max(1, _BLOCK // n)
    for lo in range(0, resamples, step):
        k = min(step, resamples - lo)
        means[lo:lo + k] = _row_sums(values[draws.below(n, k * n).reshape(k, n)]) / n
    return means


def bootstrap_mean(values: Sequence[float], seed: int = SEED, resamples: int = RESAMPLES) -> list[float] | None:
    import numpy as np

    n = len(values)
    if n < 2:
        return None
    means = _resampled_means(np.asarray(values, dtype=float), _Draws(seed), resamples)
    return _percentiles(means.tolist())


def paired(base: Sequence[float], new: Sequence[float], seed: int = SEED,
           resamples: int = RESAMPLES) -> dict:
    """``new - base`` over paired instances: mean difference, paired-bootstrap 95%
    interval, and the two-sided p-value of a paired permutation (sign-flip) test."""
    import numpy as np

    diffs = [b - a for a, b in zip(base, new)]
    n = len(diffs)
    if n == 0:
        return {"n": 0, "diff": None, "ci95": None, "p_value": None}
    mean = sum(diffs) / n
    draws = _Draws(seed)
    d = np.asarray(diffs, dtype=float)
    boots = _resampled_means(d, draws, resamples).tolist() if n > 1 else [mean]
    observed = abs(mean)
    nonzero = d[d != 0]
    if not len(nonzero):
        p = 1.0
    else:
        extreme, m = 0, len(nonzero)
        step = max(1, _BLOCK // m)
        for lo in range(0, resamples, step):
            k = min(step, resamples - lo)
            flipped = _row_sums(np.where(draws.heads(k * m).reshape(k, m), nonzero, -nonzero)) / n
            extreme += int(np.count_nonzero(np.abs(flipped) >= observed - 1e-12))
        p = (extreme + 1) / (resamples + 1)
    return {"n": n, "diff": mean, "ci95": _percentiles(boots) if n > 1 else None, "p_value": p}


def describe(values: Sequence[float], quantiles: Mapping[str, float], bins: int) -> dict | None:
    """Of ``values`` sorted ascending: the standard deviation, min, quantiles (linear
    interpolation), max and a histogram whose range is [min, max] widened to tenths."""
    n = len(values)
    if n == 0:
        return None
    mean = sum(values) / n
    out: dict = {"std": math.sqrt(sum((v - mean) ** 2 for v in values) / n), "min": values[0]}
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
