"""A panel of judges (issue 61): several judges score each item, and the panel's score is their
aggregate, with what the panel is worth measured rather than assumed.

PoLL (Verga et al., 2024) found three small judges of different families agree with people better
than one large judge; a 2026 study found nine correlated judges worth about two independent votes.
So each member's score and reason are kept on the item, and the entry's results give each member's
mean, the panel's inter-rater agreement (Krippendorff's alpha, ordinal for ratings: ``alpha``), its
effective number of independent votes, and the items where a majority rule found none. Pure: the
worker that scores an item (``evalq.workers.judge.panel``) calls ``combine``; the rating aggregate
keeps a ``PanelStats`` (mergeable: chunk parts add up) when items carry ``members``.

- ``combine``: the panel's score of one item from its members' (``mean``; ``median``; ``majority``,
  a score more than half of the answering members gave, else the median, with ``majority: false``
  on the item: the stated outcome when there is none).
- Krippendorff's alpha from the coincidence matrix, which adds up over items (and chunks):
  ``alpha = 1 - (n - 1) * sum(o_ck * d_ck) / sum(n_c * n_k * d_ck)``, ordinal distances
  ``d_ck = (sum_{g=c..k} n_g - (n_c + n_k) / 2) ** 2`` (Krippendorff 2011); equal to the
  ``krippendorff`` package's ``alpha(level_of_measurement="ordinal")``.
- Effective votes: ``m / (1 + (m - 1) * r)``, ``r`` the mean Pearson correlation between two
  members' scores over the items both scored (Kish's design effect for equicorrelated raters):
  ``m`` independent judges are worth ``m`` votes, ``m`` copies of one judge worth one.
"""

from __future__ import annotations

import math
import statistics
from itertools import combinations
from typing import Any, Literal

PanelAggregate = Literal["mean", "median", "majority"]


def combine(scores: dict[str, float], how: str) -> tuple[float, bool | None]:
    """(the panel's score, whether a strict majority was found: None unless ``majority``)."""
    values = list(scores.values())
    if how == "mean":
        return sum(values) / len(values), None
    if how == "median":
        return float(statistics.median(values)), None
    top, count = max(((v, values.count(v)) for v in set(values)), key=lambda vc: (vc[1], -vc[0]))
    if count * 2 > len(values):
        return float(top), True
    return float(statistics.median(values)), False


class PanelStats:
    """What an entry's items say of its panel, as sums that merge."""

    def __init__(self) -> None:
        self.members: dict[str, list[float]] = {}     # name -> [n, sum, sumsq]
        self.pairs: dict[str, list[float]] = {}       # "a|b" -> [n, sx, sy, sxx, syy, sxy]
        self.coincidence: dict[str, float] = {}       # "c|k" -> o_ck
        self.no_majority = 0
        self.failed: dict[str, int] = {}              # name -> items it gave no score
        self.passed = 0                               # items whose panel score met the entry's threshold

    def add(self, result: dict, threshold: float | None = None) -> None:
        members = result.get("members")
        if not isinstance(members, dict):
            return
        self.passed += threshold is not None and result.get("score", float("-inf")) >= threshold
        scores = {name: float(m["score"]) for name, m in members.items()
                  if isinstance(m, dict) and isinstance(m.get("score"), (int, float))}
        for name in members:
            if name not in scores:
                self.failed[name] = self.failed.get(name, 0) + 1
        for name, v in scores.items():
            acc = self.members.setdefault(name, [0, 0.0, 0.0])
            acc[0] += 1
            acc[1] += v
            acc[2] += v * v
        for a, b in combinations(sorted(scores), 2):
            x, y = scores[a], scores[b]
            acc = self.pairs.setdefault(f"{a}|{b}", [0, 0.0, 0.0, 0.0, 0.0, 0.0])
            for i, add in enumerate((1, x, y, x * x, y * y, x * y)):
                acc[i] += add
        m = len(scores)
        if m >= 2:  # a pairable unit: each ordered pair of its values, weighted 1 / (m - 1)
            values = list(scores.values())
            for i, c in enumerate(values):
                for j, k in enumerate(values):
                    if i != j:
                        key = f"{_key(c)}|{_key(k)}"
                        self.coincidence[key] = self.coincidence.get(key, 0.0) + 1.0 / (m - 1)
        if result.get("majority") is False:
            self.no_majority += 1

    def state(self) -> dict[str, Any]:
        return {"members": self.members, "pairs": self.pairs, "coincidence": self.coincidence,
                "no_majority": self.no_majority, "failed": self.failed, "passed": self.passed}

    def merge(self, state: dict[str, Any]) -> None:
        for name, acc in state.get("members", {}).items():
            mine = self.members.setdefault(name, [0, 0.0, 0.0])
            for i, v in enumerate(acc):
                mine[i] += v
        for pair, acc in state.get("pairs", {}).items():
            mine = self.pairs.setdefault(pair, [0, 0.0, 0.0, 0.0, 0.0, 0.0])
            for i, v in enumerate(acc):
                mine[i] += v
        for key, v in state.get("coincidence", {}).items():
            self.coincidence[key] = self.coincidence.get(key, 0.0) + v
        self.no_majority += state.get("no_majority", 0)
        self.passed += state.get("passed", 0)
        for name, n in state.get("failed", {}).items():
            self.failed[name] = self.failed.get(name, 0) + n

    def result(self) -> dict[str, Any] | None:
        if not self.members:
            return None
        names = sorted(set(self.members) | set(self.failed))
        out: dict[str, Any] = {
            "members": {name: {"mean": acc[1] / acc[0] if acc[0] else None, "n": int(acc[0]),
                               **({"failed": self.failed[name]} if self.failed.get(name) else {})}
                        for name in names for acc in [self.members.get(name, [0, 0.0, 0.0])]}}
        alpha = ordinal_alpha(self.coincidence)
        if alpha is not None:
            out["alpha"] = alpha
        r = mean_correlation(self.pairs)
        m = len(self.members)
        if r is not None:
            out["mean_correlation"] = r
            out["effective_votes"] = m / (1 + (m - 1) * max(r, 0.0))  # a negative r counts as none
        out["no_majority"] = self.no_majority
        return out


def _key(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def ordinal_alpha(coincidence: dict[str, float]) -> float | None:
    """Krippendorff's alpha (ordinal) from a coincidence matrix ``{"c|k": o_ck}``; None when the
    values cannot vary (one value only, or no pairable unit)."""
    if not coincidence:
        return None
    cells = {(float(c), float(k)): o for (c, _, k), o in ((key.partition("|"), o) for key, o in coincidence.items())}
    values = sorted({c for c, _ in cells} | {k for _, k in cells})
    totals = {v: sum(o for (c, _), o in cells.items() if c == v) for v in values}
    n = sum(totals.values())
    if len(values) < 2 or n <= 1:
        return None
    index = {v: i for i, v in enumerate(values)}

    def distance(c: float, k: float) -> float:
        lo, hi = sorted((index[c], index[k]))
        between = sum(totals[values[g]] for g in range(lo, hi + 1))
        return (between - (totals[c] + totals[k]) / 2.0) ** 2

    observed = sum(o * distance(c, k) for (c, k), o in cells.items())
    expected = sum(totals[c] * totals[k] * distance(c, k) for c in values for k in values)
    if expected == 0:
        return None
    return 1.0 - (n - 1) * observed / expected


def mean_correlation(pairs: dict[str, list[float]]) -> float | None:
    """The mean Pearson correlation over member pairs (pairs whose scores do not vary left out)."""
    found = []
    for n, sx, sy, sxx, syy, sxy in pairs.values():
        if n < 2:
            continue
        vx, vy = sxx - sx * sx / n, syy - sy * sy / n
        if vx <= 0 or vy <= 0:
            continue
        found.append((sxy - sx * sy / n) / math.sqrt(vx * vy))
    return sum(found) / len(found) if found else None
