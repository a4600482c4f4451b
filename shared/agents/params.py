"""Parameters of the trajectory metrics."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from evalq.shared.params import Params


class TrajectoryParams(Params):
    argument_match: Literal["exact", "subset"] = Field(
        default="exact", description="exact: a call's arguments equal the expected ones; subset: the expected "
        "arguments are among the call's, with equal values (extra arguments allowed)")
    strict_order: bool = Field(default=True, description="sequence_accuracy (ragas' ToolCallAccuracy): the calls "
                               "in the expected order; false: in any order")


class ToolCallF1Params(Params):
    """ragas' ToolCallF1 has no parameters."""
