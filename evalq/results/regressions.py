"""Is a run worse than its suite's recent past? Pure functions over values, no database.

For each of the run's series (an entry's field: ``bleu`` ``mean``, ``violence`` ``defect_rate``,
``rouge`` ``rougeL``) the baseline is what the suite's last N runs that ended ``done`` have
of it (N = ``regression.baseline``, default 7):

- **paired**, when those runs kept per-instance values and share at least half of this
  run's instance ids (at least 2): per shared instance, the baseline is the mean of its
  values over the baseline runs; the move is the mean of (new - baseline) with ``evalq
  compare``'s paired test (``evalq.shared.scores.stats.paired``: paired bootstrap, sign-flip
  permutation p-value) up to ``EXACT_MAX`` pairs, and the normal approximation of the
  same test above it (a t statistic; with that many pairs the two agree, and the
  resampling would cost the final callback minutes);
- **unpaired** otherwise: the run's mean against the baseline runs' pooled mean, with
  Welch's test from the means, standard deviations and counts each run kept.

A regression is a move in the worse direction (lower for scores, ratings and their
fields; higher for ``defect_rate``) that is significant (``p < alpha``, default 0.05) and
at least ``min_effect`` in the value's own units (default 0.01). Unchanged or better
series are never flagged.
"""

from __future__ import annotations

import math
from typing import Sequence

from evalq.shared.scores import stats
from evalq.shared.scores.stats import columns
from evalq.shared.job.nightly import Regression

EXACT_MAX = 500  # pairs up to which the resampling test runs as in ``evalq compare``


def worse_direction(field: str, metric: str | None = None) -> str:
    """Which way a field gets worse: as the metric's registry entry says (``MetricSpec.worse``:
    a word error rate up, a stereotyping share neither way), else defect rates up and everything
    else down."""
    from evalq.shared.metrics.registry import REGISTRY

    own = REGISTRY.get(metric).worse_direction(field) if metric is not None and metric in REGISTRY else None
    return own or ("higher" if field == "defect_rate" else "lower")


def detect(series: list[dict], baseline: dict[tuple[str, str, str], list[dict]], settings: Regression) -> list[dict]:
    """The regressions among ``series`` (dicts with slot, metric, name, field, value, n, sd,
    worse and optionally items) against ``baseline`` (per (metric, name, field) the baseline
    runs' value, n, sd, items)."""
    found = []
    for s in series:
        past = baseline.get((s["metric"], s["name"], s["field"]))
        # "neither": an ideal in the middle (prompt_stereotyping's 0.5), no side is worse
        if not past or s.get("value") is None or not s.get("n") or s["worse"] == "neither":
            continue
        move = paired_move(s, past) or unpaired_move(s, past)
        if move is None:
            continue
        delta, p_value, base_value, paired, n = move
        worse = delta < 0 if s["worse"] == "lower" else delta > 0
        if worse and p_value < settings.alpha and abs(delta) >= settings.min_effect:
            found.append({"slot": s["slot"], "metric": s["metric"], "name": s["name"], "field": s["field"],
                          "value": s["value"], "baseline": base_value, "delta": delta, "p_value": p_value,
                          "paired": paired, "n": n, "baseline_runs": len(past)})
    return found


def paired_move(s: dict, past: list[dict]) -> tuple[float, float, float, bool, int] | None:
    """(delta, p, baseline, True, pairs) over the instances this run shares with the baseline runs
    (each shared instance's baseline: the mean of its values over the runs that have it)."""
    import numpy as np

    if not s.get("items"):
        return None
    ids, values = columns(s["items"])
    kept = [columns(p["items"]) for p in past if p.get("items")]
    if not kept:
        return None
    n = len(ids)
    sums, counts = np.zeros(n), np.zeros(n)
    positions = None
    for past_ids, past_values in kept:
        if len(past_ids) == n and past_ids == ids:  # the same instances in the same order: the usual night
            at, vals = np.arange(n), np.asarray(past_values, dtype=float)
        else:
            if positions is None:
                positions = {iid: k for k, iid in enumerate(ids)}
            at = np.fromiter((positions.get(iid, -1) for iid in past_ids), dtype=np.int64, count=len(past_ids))
            found = at >= 0
            at, vals = at[found], np.asarray(past_values, dtype=float)[found]
        sums += np.bincount(at, weights=vals, minlength=n)
        counts += np.bincount(at, minlength=n)
    shared = counts > 0
    pairs = int(shared.sum())
    if pairs < max(2, n / 2):
        return None
    base = sums[shared] / counts[shared]
    new = np.asarray(values, dtype=float)[shared]
    if pairs <= EXACT_MAX:
        result = stats.paired(base.tolist(), new.tolist())
        delta, p_value = result["diff"], result["p_value"]
    else:
        delta, p_value = normal_paired(base, new)
    return delta, p_value, float(base.mean()), True, pairs


def normal_paired(base: Sequence[float], new: Sequence[float]) -> tuple[float, float]:
    """Mean difference and two-sided p-value of the paired t statistic (normal reference)."""
    import numpy as np

    diffs = np.asarray(new, dtype=float) - np.asarray(base, dtype=float)
    mean = float(diffs.mean())
    return mean, two_sided(mean, math.sqrt(float(diffs.var(ddof=1)) / len(diffs)))


def unpaired_move(s: dict, past: list[dict]) -> tuple[float, float, float, bool, int] | None:
    """(delta, p, pooled baseline, False, n) from the runs' means, standard deviations and counts."""
    # (a run on other data, ``unpaired`` False: its mean is over other items, never compared)
    usable = [p for p in past if p.get("n") and p.get("value") is not None and p.get("unpaired", True)]
    if not usable:
        return None
    total = sum(p["n"] for p in usable)
    mean = sum(p["n"] * p["value"] for p in usable) / total
    within = sum((p["n"] - 1) * (p.get("sd") or 0.0) ** 2 for p in usable)
    between = sum(p["n"] * (p["value"] - mean) ** 2 for p in usable)
    var_base = (within + between) / (total - 1) if total > 1 else 0.0
    var_new = (s.get("sd") or 0.0) ** 2
    se = math.sqrt(var_new / s["n"] + var_base / total)
    delta = s["value"] - mean
    return delta, two_sided(delta, se), mean, False, s["n"]


def two_sided(delta: float, se: float) -> float:
    if se <= 0:
        return 0.0 if delta else 1.0
    return math.erfc(abs(delta) / se / math.sqrt(2))
