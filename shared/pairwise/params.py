"""Parameters of the pairwise comparison."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from evalq.shared.core import bounds
from evalq.shared.judging.judges import JudgedParams


class PairwiseParams(JudgedParams):
    criteria: str = Field(
        default="Which answer is more helpful, correct and relevant to the question?",
        min_length=1, max_length=bounds.MAX_CRITERIA_CHARS,
        description="what makes one answer better than the other, in plain words")
    swap: bool = Field(default=True, description="ask in both orders (the candidate first, then the baseline "
                       "first); false: once, the candidate first (a judge's seat preference then goes unseen)")
    disagreement: Literal["tie", "first", "baseline"] = Field(
        default="tie", description="an item whose two verdicts disagree: a tie (default), the first order's "
        "verdict, or a win for the baseline (a cautious gate)")
