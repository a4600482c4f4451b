"""The simulator's token count: deterministic, no tiktoken."""

from __future__ import annotations

from typing import Any, Iterable


def count_tokens(text: str) -> int:
    """ceil(utf-8 bytes / 4)."""
    return (len(text.encode("utf-8")) + 3) // 4


def message_text(message: Any) -> str:
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = "".join(p.get("text", "") for p in content
                       if isinstance(p, dict) and isinstance(p.get("text", ""), str))
    else:
        text = ""
    for call in message.get("tool_calls") or ():
        if isinstance(call, dict) and isinstance(call.get("function"), dict):
            args = call["function"].get("arguments")
            if isinstance(args, str):
                text += args
    return text


def count_prompt_tokens(messages: Iterable[Any]) -> int:
    """sum over messages of 4 + count_tokens(message text)."""
    return sum(4 + count_tokens(message_text(m)) for m in messages)
