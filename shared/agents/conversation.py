"""A conversation's turns, read one way by the metrics that score turns and by the report.

A turn is a user message and every message after it up to the next user message: the
assistant's replies, its tool calls and their results. Messages before the first user message
(system or developer instructions) are the context of every turn. An *assistant turn* is a turn
in which the assistant spoke or called a tool; its answer is the last assistant text in it. The
last turn's answer is the instance's ``actual-output`` where it has one (a record may keep the
final answer apart from the history, as HarpIA's does), so a conversation whose messages end
with the user's question still has its last turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

TurnChoice = Literal["last", "all"]


@dataclass(frozen=True)
class Turn:
    number: int  # 1-based, among the conversation's assistant turns
    start: int  # index of the turn's first message in ``messages``
    end: int  # one past its last message
    answer: str | None


def _text(msg: dict) -> str | None:
    content = msg.get("content")
    return content if isinstance(content, str) and content.strip() else None


def turns(messages: list[dict], final: str | None = None) -> list[Turn]:
    """The assistant turns of a validated conversation, in order."""
    starts = [i for i, m in enumerate(messages) if m.get("role") == "user"] or [0]
    bounds = list(zip(starts, starts[1:] + [len(messages)]))
    found: list[Turn] = []
    for k, (start, end) in enumerate(bounds):
        said = [m for m in messages[start:end] if m.get("role") == "assistant"]
        last = k == len(bounds) - 1
        if not said and not (last and final):
            continue
        answers = [t for t in map(_text, said) if t is not None]
        answer = final if last and final else (answers[-1] if answers else None)
        found.append(Turn(len(found) + 1, start, end, answer))
    return found


def turn_view(instance: dict, turn: Turn) -> dict:
    """The instance as it stood at the end of ``turn``: the messages up to it, its answer as the
    output (none when the assistant only called tools)."""
    view = {**instance, "messages": instance["messages"][:turn.end]}
    view.pop("actual-output", None)
    if turn.answer is not None:
        view["actual-output"] = turn.answer
    return view
