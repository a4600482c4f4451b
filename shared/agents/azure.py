"""Azure AI Evaluation's agent format, read into OpenAI chat messages (the ``azure_agent`` preset).

A record holds ``query`` (the system and user messages, or a string) and ``response`` (the agent's
messages), whose ``content`` is a string or a list of parts: ``{"type": "text", "text"}``,
``{"type": "tool_call", "tool_call_id", "name", "arguments": {...}}`` in assistant messages, and
``{"type": "tool_result", "tool_result": ...}`` in ``tool`` messages (which carry
``tool_call_id``); ``tool_definitions`` is ``[{"name", "description", "parameters"}]``. Every part
is kept: a part of another type is an error naming it, never dropped.
"""

from __future__ import annotations

import json
from typing import Any


class AzureAgentError(ValueError):
    pass


def _messages(raw: Any, where: str) -> list[dict]:
    if raw is None:
        return []
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}] if where == "query" else [{"role": "assistant", "content": raw}]
    if not isinstance(raw, list):
        raise AzureAgentError(f"{where}: expected a list of messages or a string")
    out = []
    for m, msg in enumerate(raw):
        at = f"{where}[{m}]"
        if not isinstance(msg, dict) or "role" not in msg:
            raise AzureAgentError(f"{at}: expected a message with a role")
        content = msg.get("content")
        texts, calls = [], []
        parts = content if isinstance(content, list) else [{"type": "text", "text": content}] \
            if isinstance(content, str) else []
        for p, part in enumerate(parts):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                texts.append(str(part.get("text", "")))
            elif kind == "tool_call":
                calls.append({"id": part.get("tool_call_id"), "type": "function",
                              "function": {"name": part.get("name"),
                                           "arguments": json.dumps(part.get("arguments", {}), ensure_ascii=False)}})
            elif kind == "tool_result":
                result = part.get("tool_result")
                texts.append(result if isinstance(result, str) else json.dumps(result, ensure_ascii=False))
            else:
                raise AzureAgentError(f"{at}.content[{p}]: a part of type {kind!r} (text, tool_call and "
                                      "tool_result are read)")
        message: dict[str, Any] = {"role": msg["role"], "content": "\n".join(texts) if texts else None}
        if calls:
            message["tool_calls"] = calls
        if msg["role"] == "tool":
            message["tool_call_id"] = msg.get("tool_call_id")
        out.append(message)
    return out


def to_instance(inst: dict) -> dict:
    """An instance mapped by the preset (``query``, ``response``, ...) as evalq's agent instance:
    ``messages``; ``input`` the last user text, ``actual-output`` the agent's last text."""
    messages = _messages(inst.pop("query", None), "query") + _messages(inst.pop("response", None), "response")
    inst["messages"] = messages
    users = [m["content"] for m in messages if m["role"] == "user" and m["content"]]
    answers = [m["content"] for m in messages if m["role"] == "assistant" and m["content"] and not m.get("tool_calls")]
    if users:
        inst.setdefault("input", users[-1])
    if answers:
        inst.setdefault("actual-output", answers[-1])
    return inst
