"""What a judge call returns to a metric: the reply's text (or tool-call arguments) and
what it cost. Made by the judge client, by the job's reply memo and cache, and by the
capacity planner's stand-in judge."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Reply:
    content: str | None
    tool_arguments: str | None
    usage: dict = field(default_factory=dict)
    cached: bool = False

    def text(self) -> str:
        return self.tool_arguments if self.tool_arguments is not None else (self.content or "")
