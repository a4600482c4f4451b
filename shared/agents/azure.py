"""Azure AI Evaluation's agent format, read into OpenAI chat messages (the ``azure_agent`` preset).

A record holds ``query`` (the system and user messages, or a string) and ``response`` (the agent's
messages, or a string), whose ``content`` is a string or a list of parts in any form Azure's own
parser reads (``evalq.shared.agents.messages``: text parts, tool calls flat or nested, tool results
as text or objects); ``tool_definitions`` is ``[{"name", "description", "parameters"}]``. Every
part is kept, and every problem is named where the record has it (``response[0].content[1]``).
"""

from __future__ import annotations

from typing import Any

from evalq.shared.agents.messages import ORIGIN, Origin, Plain, read


class AzureAgentError(ValueError):
    pass


def _messages(raw: Any, where: str, problems: list[str]) -> tuple[list[dict], Origin]:
    if raw is None:
        return [], Origin()
    if isinstance(raw, str):
        return [{"role": "user" if where == "query" else "assistant", "content": raw}], Origin([where], [[]])
    if not isinstance(raw, list):
        problems.append(f"{where}: expected a list of messages or a string")
        return [], Origin()
    return read(raw, where, problems)


def to_instance(inst: dict) -> dict:
    """An instance mapped by the preset (``query``, ``response``, ...) as evalq's agent instance:
    ``messages``; ``input`` the last user text, ``actual-output`` the agent's last text. Its
    ``ORIGIN`` maps each message back to the record, for the checker's messages."""
    problems: list[str] = []
    asked, asked_at = _messages(inst.pop("query", None), "query", problems)
    answered, answered_at = _messages(inst.pop("response", None), "response", problems)
    if problems:
        raise AzureAgentError("; ".join(problems[:10]))
    messages = asked + answered
    inst["messages"] = messages
    asked_at = asked_at.explicit() if isinstance(asked_at, Plain) else asked_at
    inst[ORIGIN] = asked_at.then(answered_at)
    users = [m["content"] for m in messages if m.get("role") == "user" and m.get("content")]
    answers = [m["content"] for m in messages
               if m.get("role") == "assistant" and m.get("content") and not m.get("tool_calls")]
    if users:
        inst.setdefault("input", users[-1])
    if answers:
        inst.setdefault("actual-output", answers[-1])
    return inst
