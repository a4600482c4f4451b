"""Parameters of the trajectory metrics."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from evalq.shared.agents.conversation import TurnChoice
from evalq.shared.judging.judges import JudgeParams
from evalq.shared.core.strict import Params


class TrajectoryParams(Params):
    argument_match: Literal["exact", "subset"] = Field(
        default="exact", description="exact: a call's arguments equal the expected ones; subset: the expected "
        "arguments are among the call's, with equal values (extra arguments allowed)")
    strict_order: bool = Field(default=True, description="sequence_accuracy (ragas' ToolCallAccuracy): the calls "
                               "in the expected order; false: in any order")


class ToolCallF1Params(Params):
    """ragas' ToolCallF1 has no parameters."""


class TurnsParams(JudgeParams):
    """Agent judge metrics over ``messages``: the last assistant turn, or every one."""

    turns: TurnChoice = Field(
        default="last", description="last: score the conversation's last assistant turn; all: score every "
        "assistant turn (each on the conversation up to it), per-turn results in the log, the item's score "
        "their mean")
