"""An agent instance's trajectory, read one way for validation and for the metrics.

- ``messages``: OpenAI chat messages; an assistant message's ``tool_calls`` are
  ``{"id", "type": "function", "function": {"name", "arguments": <JSON object as text>}}``
  (arguments given as an object are taken too); a ``tool`` message answers one earlier call by
  its ``tool_call_id``.
- ``tool_definitions``: OpenAI's ``{"type": "function", "function": {"name", "description",
  "parameters": <JSON schema>}}`` or the flat ``{"name", "description", "parameters"}``.
- ``expected_tool_calls``: ``[{"name", "arguments": {...}}]``, in the order expected.

Validation is strict and located: a call that names no defined tool, arguments that are not a
JSON object, a ``tool`` message that answers no call; nothing is dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from evalq.shared.agents.messages import ORIGIN, ROLES, Origin
from evalq.shared.agents.messages import read as read_messages
from evalq.shared.core.memo import per_instance


def canonical(value: Any) -> Any:
    """A JSON value as arguments are compared: numbers by value (JSON has one number type, so
    ``10.0`` is ``10``), booleans apart from numbers (``true`` is not ``1``), objects by their keys."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [canonical(v) for v in value]
    return value


def value_key(value: Any) -> Any:
    """One comparable, hashable key per JSON value, equal for equal JSON values: numbers by value
    (``10.0`` is ``10``), booleans tagged apart from numbers (Python's ``==`` would take ``True`` for
    ``1``), objects whatever their key order. Strings are their own key: most arguments are strings."""
    if isinstance(value, str) or value is None:
        return value
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, (int, float)):
        return ("n", int(value) if isinstance(value, float) and value.is_integer() else value)
    if isinstance(value, dict):
        return ("o", tuple(sorted((k, value_key(v)) for k, v in value.items())))
    if isinstance(value, list):
        return ("a", tuple(value_key(v) for v in value))
    return ("?", repr(value))


@dataclass(frozen=True)
class Call:
    name: str
    arguments: dict
    id: str | None = None

    @cached_property
    def args_key(self) -> Any:
        """The arguments as one comparable, hashable key (``value_key``), made once per call: a
        trajectory compares each call with many."""
        return value_key(self.arguments)

    @cached_property
    def arg_keys(self) -> dict[str, Any]:
        """Each argument's comparable key (``value_key``), by name."""
        return {k: value_key(v) for k, v in self.arguments.items()}

    def key(self) -> tuple:
        """Name and arguments as one comparable, hashable key (argument order does not matter;
        numbers by value)."""
        return (self.name, self.args_key)


def _arguments(raw: Any, where: str, problems: list[str]) -> dict | None:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            value = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError as exc:
            problems.append(f"{where}: arguments are not JSON ({exc.msg} at column {exc.colno})")
            return None
        if isinstance(value, dict):
            return value
    problems.append(f"{where}: arguments must be a JSON object, got {type(raw).__name__}")
    return None


def definitions(raw: Any, problems: list[str]) -> dict[str, dict] | None:
    """Tool name -> its parameters' JSON schema (None when the instance has no definitions)."""
    if raw is None:
        return None
    if not isinstance(raw, list):
        problems.append("'tool_definitions' must be a list of tools")
        return None
    tools: dict[str, dict] = {}
    for i, tool in enumerate(raw):
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            problems.append(f"tool_definitions[{i}]: expected {{'name', 'parameters'}} (or OpenAI's "
                            "{'type': 'function', 'function': {...}}), got no name")
            continue
        if name in tools:
            problems.append(f"tool_definitions[{i}]: tool {name!r} is defined twice")
        schema = fn.get("parameters", {})
        if not isinstance(schema, dict):
            problems.append(f"tool_definitions[{i}] ({name}): parameters must be a JSON schema object")
            schema = {}
        tools[name] = schema
    return tools


def calls(messages: Any, problems: list[str], tools: dict[str, dict] | None = None,
          origin: Origin | None = None) -> list[Call]:
    """The tool calls the assistant made, in order, with what is wrong with the messages (each
    named where ``origin`` says the record has it; by default, its index in ``messages``)."""
    if not isinstance(messages, list):
        problems.append("'messages' must be a list of chat messages")
        return []
    origin = origin or Origin()
    made: list[Call] = []
    open_ids: set[str] = set()
    for m, msg in enumerate(messages):
        where = origin.message(m)
        if not isinstance(msg, dict) or msg.get("role") not in ROLES:
            problems.append(f"{where}: expected a chat message with a role ({', '.join(ROLES)})")
            continue
        if msg["role"] == "tool":
            answered = msg.get("tool_call_id")
            if answered not in open_ids:
                problems.append(f"{where}: a tool message answers no call (tool_call_id {answered!r})")
            open_ids.discard(answered)
            continue
        for c, tc in enumerate(msg.get("tool_calls") or [] if msg["role"] == "assistant" else []):
            fn = tc.get("function") if isinstance(tc, dict) else None
            call = _call(fn, origin.call(m, c), "calls", tools, problems,
                         "{'id', 'type': 'function', 'function': {'name', 'arguments'}}")
            if call is not None:
                made.append(Call(call.name, call.arguments, tc.get("id")))
            if isinstance(tc, dict) and tc.get("id") is not None:
                open_ids.add(tc["id"])
    return made


def _call(raw: Any, at: str, verb: str, tools: dict[str, dict] | None, problems: list[str],
          shape: str) -> Call | None:
    """One call (``{"name", "arguments"}``) read, or None with its problems said."""
    name = raw.get("name") if isinstance(raw, dict) else None
    if not isinstance(name, str) or not name:
        problems.append(f"{at}: expected {shape}")
        return None
    if tools is not None and name not in tools:
        problems.append(f"{at}: {verb} {name!r}, which tool_definitions do not define")
    args = _arguments(raw.get("arguments", {}), f"{at} ({name})", problems)
    return Call(name, args) if args is not None else None


def expected(raw: Any, problems: list[str], tools: dict[str, dict] | None = None) -> list[Call]:
    if not isinstance(raw, list):
        problems.append("'expected_tool_calls' must be a list of {'name', 'arguments'}")
        return []
    found = (_call(c, f"expected_tool_calls[{i}]", "names", tools, problems, "{'name', 'arguments'}")
             for i, c in enumerate(raw))
    return [c for c in found if c is not None]


def check(inst: dict) -> list[str]:
    """Every problem of an agent instance's messages, definitions and expected calls, and its size
    against ``EVALQ_MAX_MESSAGES`` / ``EVALQ_MAX_TOOL_CALLS`` / ``EVALQ_MAX_RUN_BYTES``."""
    from evalq.shared.core.bounds import (MESSAGES_DEFAULT, MESSAGES_ENV, RUN_BYTES_DEFAULT, RUN_BYTES_ENV,
                                     TOOL_CALLS_DEFAULT, TOOL_CALLS_ENV)
    from evalq.shared.core.config import env_number

    problems: list[str] = []
    origin = inst.pop(ORIGIN, None)  # where a reader found each message (never stored)
    tools = definitions(inst.get("tool_definitions"), problems)
    if "messages" in inst:
        # every form evalq reads (content parts, Azure's call and result parts) into one, in place
        inst["messages"], read_from = read_messages(inst["messages"], "messages", problems)
        messages = inst["messages"]
        made = calls(messages, problems, tools, origin or read_from)
        for what, n, env, default in (("messages", len(messages), MESSAGES_ENV, MESSAGES_DEFAULT),
                                      ("tool calls", len(made), TOOL_CALLS_ENV, TOOL_CALLS_DEFAULT),
                                      ("bytes of text", run_bytes(messages), RUN_BYTES_ENV, RUN_BYTES_DEFAULT)):
            limit = int(env_number(env, default))
            if limit and n > limit:
                problems.append(f"the run has {n:,} {what}, over the limit of {limit:,} ({env} raises it)")
    if "expected_tool_calls" in inst:
        expected(inst["expected_tool_calls"], problems, tools)
    return problems


def run_bytes(messages: list) -> int:
    """A run's size as a judge is sent it: the UTF-8 bytes of every message's text (or parts), every
    call's name and arguments, every tool result."""
    def size(value: Any) -> int:
        if value is None:
            return 0
        if isinstance(value, str):
            return len(value.encode("utf-8", errors="surrogatepass"))
        return len(json.dumps(value, ensure_ascii=False).encode("utf-8", errors="surrogatepass"))

    total = 0
    for msg in messages:
        if not isinstance(msg, dict):
            continue
        total += size(msg.get("content"))
        for tc in msg.get("tool_calls") or [] if isinstance(msg.get("tool_calls"), list) else []:
            fn = tc.get("function") if isinstance(tc, dict) else None
            if isinstance(fn, dict):
                total += size(fn.get("name")) + size(fn.get("arguments"))
    return total


@per_instance
def read(inst: dict) -> tuple[list[Call], list[Call], dict[str, dict] | None]:
    """(calls made, calls expected, tool schemas) of a validated instance; read once for every
    entry of a chunk that scores several (``evalq.shared.core.memo``), so not to be changed."""
    ignored: list[str] = []
    tools = definitions(inst.get("tool_definitions"), ignored)
    return (calls(inst.get("messages") or [], ignored), expected(inst.get("expected_tool_calls") or [], ignored),
            tools)


def side_by_side(made: list[Call], wanted: list[Call]) -> list[tuple[Call | None, Call | None, str]]:
    """The calls made against the calls expected, aligned the way a reader compares them: the
    longest run of calls to the same tools in the same order pairs up, then each row is ``same``,
    ``arguments differ``, ``extra`` (made, not expected) or ``missing`` (expected, not made). A
    reordered call shows as extra where it was made and missing where it was expected."""
    from difflib import SequenceMatcher

    rows: list[tuple[Call | None, Call | None, str]] = []
    matcher = SequenceMatcher(a=[c.name for c in made], b=[c.name for c in wanted], autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            rows += [(a, b, "same" if a.args_key == b.args_key else "arguments differ")
                     for a, b in zip(made[i1:i2], wanted[j1:j2])]
        else:
            rows += [(a, None, "extra") for a in made[i1:i2]] + [(None, b, "missing") for b in wanted[j1:j2]]
    return rows
