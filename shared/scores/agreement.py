"""How often a judge agrees with human grades (seed 004: measure the judge against people),
mergeable per chunk like the aggregates."""

from __future__ import annotations

import math
from typing import Any

from evalq.shared.scores.results import human_defect, is_defect, rating_scale


class Agreement:
    """How often the judge agrees with human grades, mergeable per chunk.

    Ratings keep a contingency table of (judge score, human grade) counts, from
    which exact and within-one agreement, Cohen's kappa with quadratic weights
    and Spearman's rank correlation (midranks for ties) follow exactly. Defect
    metrics keep the 2x2 table: the defect precision and recall of the judge
    against the human labels.
    """

    def __init__(self, kind: str, params: dict | None = None) -> None:
        self.kind = kind
        self.params = params or {}
        self.cells: dict[str, int] = {}  # "judge,human" -> count
        self.members: dict[str, Agreement] = {}  # a panel's members, each against the same grades

    def add(self, record: dict[str, Any]) -> None:
        if "human" not in record or "result" not in record or record.get("error") is not None \
                or record.get("variant") is not None:
            return
        result, grade = record["result"], record["human"]
        if self.kind == "rating":
            score = result.get("score") if isinstance(result, dict) else None
            if isinstance(score, float) and not isinstance(score, bool):
                score = int(round(score))  # a panel's mean between two points: the nearest
            if not isinstance(score, int) or isinstance(score, bool):
                return
            key = f"{score},{int(grade)}"
            for name, member in (result.get("members") or {}).items():
                if isinstance(member, dict) and isinstance(member.get("score"), int):
                    self.members.setdefault(name, Agreement(self.kind, self.params)).add(
                        {"result": member, "human": grade})
        else:
            threshold = self.params.get("threshold")
            key = f"{int(is_defect(result, threshold))},{int(human_defect(grade, threshold))}"
        self.cells[key] = self.cells.get(key, 0) + 1

    def state(self) -> dict[str, int]:
        # a member's cells as "<member>|judge,human" (a panel's); the panel's own as before
        return {**self.cells, **{f"{name}|{key}": n for name, member in self.members.items()
                                 for key, n in member.cells.items()}}

    def merge(self, state: dict[str, int]) -> None:
        for key, count in state.items():
            name, bar, cell = key.rpartition("|")
            cells = self.members.setdefault(name, Agreement(self.kind, self.params)).cells if bar else self.cells
            cells[cell] = cells.get(cell, 0) + count

    def pairs(self) -> list[tuple[int, int, int]]:
        return [(*map(int, key.split(",")), n) for key, n in sorted(self.cells.items())]

    def result(self) -> dict[str, Any] | None:
        pairs = self.pairs()
        n = sum(c for _, _, c in pairs)
        if n == 0:
            return None
        if self.kind == "defect":
            tp = sum(c for j, h, c in pairs if j and h)
            fp = sum(c for j, h, c in pairs if j and not h)
            fn = sum(c for j, h, c in pairs if not j and h)
            return {"n": n, "precision": tp / (tp + fp) if tp + fp else None,
                    "recall": tp / (tp + fn) if tp + fn else None,
                    "exact": sum(c for j, h, c in pairs if j == h) / n}
        lo, hi = rating_scale(self.params)
        out = {"n": n, "exact": sum(c for j, h, c in pairs if j == h) / n,
               "within_1": sum(c for j, h, c in pairs if abs(j - h) <= 1) / n,
               "kappa_quadratic": _kappa_quadratic(pairs, n, lo, hi), "spearman": _spearman(pairs, n)}
        if self.members:  # a panel: each member's agreement with the same grades, beside the panel's
            out["members"] = {name: member.result() for name, member in sorted(self.members.items())}
        return out


def _kappa_quadratic(pairs: list[tuple[int, int, int]], n: int, lo: int, hi: int) -> float | None:
    """Cohen's weighted kappa, weights (i - j)^2 / (k - 1)^2 over the scale's k points."""
    k = hi - lo + 1
    if k < 2:
        return None
    judge_marginal = {v: 0 for v in range(lo, hi + 1)}
    human_marginal = dict(judge_marginal)
    observed = 0.0
    for j, h, c in pairs:
        judge_marginal[j] = judge_marginal.get(j, 0) + c
        human_marginal[h] = human_marginal.get(h, 0) + c
        observed += c * (j - h) ** 2
    expected = sum(judge_marginal[a] * human_marginal[b] * (a - b) ** 2
                   for a in judge_marginal for b in human_marginal) / n
    if expected == 0:
        return None  # every grade on one point: kappa is undefined
    return 1.0 - observed / expected


def _spearman(pairs: list[tuple[int, int, int]], n: int) -> float | None:
    """Pearson correlation of midranks (ties share the mean of their ranks)."""
    def midranks(axis: int) -> dict[int, float]:
        counts: dict[int, int] = {}
        for p in pairs:
            counts[p[axis]] = counts.get(p[axis], 0) + p[2]
        ranks, below = {}, 0
        for value in sorted(counts):
            ranks[value] = below + (counts[value] + 1) / 2
            below += counts[value]
        return ranks

    rj, rh = midranks(0), midranks(1)
    mean = (n + 1) / 2
    cov = sum(c * (rj[j] - mean) * (rh[h] - mean) for j, h, c in pairs)
    var_j = sum(c * (rj[j] - mean) ** 2 for j, _, c in pairs)
    var_h = sum(c * (rh[h] - mean) ** 2 for _, h, c in pairs)
    if var_j == 0 or var_h == 0:
        return None
    return cov / math.sqrt(var_j * var_h)
