"""What a pairwise entry reports (``aggregation: pairwise``), merged from chunk parts as every
aggregate is: the candidate's win, tie and loss rates over the items and its score (a win 1, a tie
1/2), with 95% intervals (Wilson's for the rates), and what the verdicts say of the judge:

- ``first_position_win_rate``: of the verdicts that picked an answer, the share that picked the one
  shown first (0.5 for a judge without a seat preference; FastChat's GPT-4 verdicts: 0.526);
- ``flip_rate``: of the items asked in both orders, the share whose two verdicts named different
  winners (the same answer should win wherever it sits);
- ``longer_win_rate``: of the verdicts that picked one of two answers of different lengths, the
  share that picked the longer (0.5 without a length preference; FastChat's: 0.68).
"""

from __future__ import annotations

from typing import Any

from evalq.shared.scores.aggregate import MeanAggregator, register_aggregator

# the numbers each item's result carries (evalq.workers.pairwise.compare), summed over the items
COUNTS = ("win", "tie", "loss", "first_seat_wins", "decided", "longer_wins", "longer_decided", "asked")


class PairwiseAggregator(MeanAggregator):
    def score(self) -> dict[str, Any] | None:
        from evalq.shared.scores.stats import score_interval, wilson

        if self.n == 0:
            return None
        total = {k: self._sum.get(k, 0.0) for k in COUNTS}
        n = self._count.get("win", 0)
        if n == 0:
            return None
        win, tie, loss = (int(total[k]) for k in ("win", "tie", "loss"))
        score = self._sum.get("score", 0.0)
        out: dict[str, Any] = {
            "score": score / n, "score_ci95": score_interval(n, score, self._sumsq.get("score", 0.0), False, (0.0, 1.0)),
            "win_rate": win / n, "win_rate_ci95": wilson(win, n), "tie_rate": tie / n, "tie_rate_ci95": wilson(tie, n),
            "loss_rate": loss / n, "loss_rate_ci95": wilson(loss, n), "wins": win, "ties": tie, "losses": loss,
            "verdicts": int(total["asked"])}
        decided, first = int(total["decided"]), int(total["first_seat_wins"])
        if decided:
            out["first_position_win_rate"] = first / decided
            out["first_position_win_rate_ci95"] = wilson(first, decided)
        swapped, flips = self._count.get("flipped", 0), int(self._sum.get("flipped", 0.0))
        if swapped:
            out["flip_rate"] = flips / swapped
            out["flip_rate_ci95"] = wilson(flips, swapped)
        longer, won = int(total["longer_decided"]), int(total["longer_wins"])
        if longer:
            out["longer_win_rate"] = won / longer
            out["longer_win_rate_ci95"] = wilson(won, longer)
        return out


register_aggregator("pairwise", PairwiseAggregator)
