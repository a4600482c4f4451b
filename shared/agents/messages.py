"""Chat messages in every form evalq reads, into one: OpenAI's chat messages, with a map back to
where each piece stood in the user's own record.

Read, in any mix, message by message:

- OpenAI Chat Completions: ``content`` a string, null, or a list of parts (``text``; ``refusal``;
  ``image_url``, ``input_audio``, ``file``, ...); an assistant's ``tool_calls``
  (``{"id", "type": "function", "function": {"name", "arguments"}}``, arguments a JSON text or an
  object); a ``tool`` message answering one call by ``tool_call_id``.
- Azure AI Evaluation's agent messages, as its own parser reads them
  (``azure.ai.evaluation._common.utils``): parts ``text``/``input_text``/``output_text``;
  ``tool_call`` flat (``tool_call_id``, ``name``, ``arguments``) or nested (``{"type": "tool_call",
  "tool_call": {"id", "type": "function", "function": {"name", "arguments"}}}``), and its other
  names ``function_call`` (flat, or nested under ``function_call``) and ``openapi_call``;
  ``tool_result`` (``tool_result``: text or any JSON), ``function_call_output`` and
  ``openapi_call_output``, in a ``tool`` message whose ``tool_call_id`` (or the part's) names the
  call.

The one form: ``{"role", "content": <text or None>}``, plus ``tool_calls`` (OpenAI's form, arguments
as JSON text), ``tool_call_id`` on a tool message, and ``parts``: the parts that are not text (an
image, an audio clip, an MCP approval), kept as they were, never dropped. A message's text is its
text parts joined by a line break (as Azure's parser joins them). A tool message with several
results becomes one tool message per result.

``Origin`` says where each message and call of the one form came from (``response[2]``,
``response[2].content[1]``, ``messages[4].tool_calls[0]``), so every problem is named at the place
the user wrote it. It rides with the instance under ``ORIGIN`` between reading a record and
checking it, and is taken off there (never stored).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool")
ORIGIN = "__origin__"  # an instance's Origin, from its reader to its checker

TEXT_PARTS = ("text", "input_text", "output_text")
CALL_PARTS = ("tool_call", "function_call", "openapi_call")
RESULT_PARTS = {"tool_result": "tool_result", "function_call_output": "function_call_output",
                "openapi_call_output": "openapi_call_output"}


@dataclass
class Origin:
    """Where each message (and each call of it) of the one form stood in the record."""
    messages: list[str] = field(default_factory=list)
    calls: list[list[str]] = field(default_factory=list)

    def message(self, m: int) -> str:
        return self.messages[m] if m < len(self.messages) else f"messages[{m}]"

    def call(self, m: int, c: int) -> str:
        if m < len(self.calls) and c < len(self.calls[m]):
            return self.calls[m][c]
        return f"{self.message(m)}.tool_calls[{c}]"

    def then(self, other: "Origin") -> "Origin":
        other = other.explicit() if isinstance(other, Plain) else other
        return Origin(self.messages + other.messages, self.calls + other.calls)


@dataclass
class Plain(Origin):
    """The origin of messages that were in the one form already, one for one: the n-th message is
    ``<where>[n]`` and its calls ``tool_calls`` (no text is made until a problem names one)."""
    where: str = "messages"
    count: int = 0

    def message(self, m: int) -> str:
        return f"{self.where}[{m}]"

    def call(self, m: int, c: int) -> str:
        return f"{self.where}[{m}].tool_calls[{c}]"

    def explicit(self) -> Origin:
        return Origin([self.message(m) for m in range(self.count)], [[] for _ in range(self.count)])


def text_of(content: Any) -> str | None:
    """The text of a message's ``content``: a string, or its text parts joined by line breaks
    (None when it has none). What input and output locations read from content given as parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") in TEXT_PARTS
                 and isinstance(p.get("text"), str)]
        texts += [p.get("refusal") for p in content if isinstance(p, dict) and p.get("type") == "refusal"
                  and isinstance(p.get("refusal"), str)]
        return "\n".join(texts) if texts else None
    return None


def read(raw: Any, where: str, problems: list[str]) -> tuple[list[dict], Origin]:
    """The messages of ``raw`` (a list, at ``where`` in the record) in the one form, with their
    origin; a part that cannot be read is a problem at its place. A message without a known role
    is passed on as it is, for the checker to name. A message in the one form already (text content,
    OpenAI's tool calls) is passed on as it is: most are."""
    if not isinstance(raw, list):
        problems.append(f"{where}: expected a list of chat messages")
        return [], Origin()
    out: list[dict] = []
    read_from: list[tuple[int, list[str] | None]] = []  # each message's index in ``raw``, its calls' places
    plain = True
    for m, msg in enumerate(raw):
        content = msg.get("content") if isinstance(msg, dict) else None
        if not isinstance(msg, dict) or msg.get("role") not in ROLES or (
                (content is None or isinstance(content, str))
                and (msg.get("tool_calls") is None or isinstance(msg["tool_calls"], list))):
            out.append(msg)  # the one form already (or no message at all: the checker names it)
            read_from.append((m, None))
            continue
        plain = False
        for one, calls_at in _one_form(msg, f"{where}[{m}]", problems):
            out.append(one)
            read_from.append((m, calls_at))
    if plain:
        return out, Plain(where=where, count=len(out))
    origin = Origin()
    for m, calls_at in read_from:
        origin.messages.append(f"{where}[{m}]")
        origin.calls.append(calls_at if calls_at is not None else [])
    return out, origin


def _one_form(msg: dict, at: str, problems: list[str]) -> list[tuple[dict, list[str]]]:
    role, content = msg["role"], msg.get("content")
    texts: list[str] = []
    calls: list[dict] = []
    calls_at: list[str] = []
    results: list[tuple[str | None, str, str]] = []  # (tool_call_id, text, place)
    kept: list[dict] = []
    if isinstance(content, str):
        texts.append(content)
    elif isinstance(content, list):
        for p, part in enumerate(content):
            place = f"{at}.content[{p}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if not isinstance(part, dict) or not isinstance(kind, str):
                problems.append(f"{place}: expected a content part with a type, got {_kind(part)}")
            elif kind in TEXT_PARTS or kind == "refusal":
                value = part.get("text" if kind != "refusal" else "refusal")
                if isinstance(value, str):
                    texts.append(value)
                else:
                    problems.append(f"{place}: a {kind} part's {'text' if kind != 'refusal' else 'refusal'} "
                                    f"must be a string, got {_kind(value)}")
            elif kind in CALL_PARTS:
                calls.append(_call_part(part, kind))
                calls_at.append(place)
            elif kind in RESULT_PARTS:
                value = part.get(RESULT_PARTS[kind])  # text as it is, JSON written out, nothing as ""
                results.append((part.get("tool_call_id"), value if isinstance(value, str) else "" if value is None
                                else json.dumps(value, ensure_ascii=False), place))
            else:  # an image, audio, a file, an MCP approval: kept, never dropped
                kept.append(part)
    elif content is not None:
        problems.append(f"{at}.content: expected a string, a list of content parts or null, got {_kind(content)}")
    if role == "assistant" and msg.get("tool_calls") is not None:
        if not isinstance(msg["tool_calls"], list):
            problems.append(f"{at}.tool_calls: expected a list of tool calls, got {_kind(msg['tool_calls'])}")
        else:
            calls = list(msg["tool_calls"]) + calls
            calls_at = [f"{at}.tool_calls[{c}]" for c in range(len(msg["tool_calls"]))] + calls_at
    if role == "tool" and results:
        own = msg.get("tool_call_id")
        return [({"role": "tool", "tool_call_id": call_id if call_id is not None else own,
                  "content": "\n".join([*texts, text]) if len(results) == 1 else text}, [])
                for call_id, text, _ in results]
    if results:  # a result part outside a tool message: kept as text
        texts += [text for _, text, _ in results]
    one: dict[str, Any] = {"role": role, "content": "\n".join(texts) if texts else None}
    if calls:
        one["tool_calls"] = calls
    if role == "tool":
        one["tool_call_id"] = msg.get("tool_call_id")
    kept = [*(msg.get("parts") if isinstance(msg.get("parts"), list) else []), *kept]  # read before: kept still
    if kept:
        one["parts"] = kept
    if isinstance(msg.get("name"), str):
        one["name"] = msg["name"]
    return [(one, calls_at)]


def _call_part(part: dict, kind: str) -> dict:
    """A call part in OpenAI's form: the nested ``{kind: {"id", "function": {...}}}`` or the flat
    ``{"tool_call_id", "name", "arguments"}``; arguments as JSON text (an object is written out)."""
    nested = part.get(kind)
    if isinstance(nested, dict) and isinstance(nested.get("function"), dict):
        fn, call_id = nested["function"], nested.get("id", part.get("tool_call_id"))
        name, args = fn.get("name"), fn.get("arguments", {})
    else:
        call_id, name, args = part.get("tool_call_id", part.get("id")), part.get("name"), part.get("arguments", {})
    if not isinstance(args, str):
        args = json.dumps(args, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def _kind(value: Any) -> str:
    from evalq.shared.core.errors import kind

    return kind(value)
