"""GenAI spans as evalq instances, in both attribute dialects.

- **OpenTelemetry GenAI semantic conventions**: ``gen_ai.operation.name`` (``chat``,
  ``text_completion``, ``generate_content``; ``invoke_agent``; ``execute_tool``),
  ``gen_ai.request.model`` / ``gen_ai.response.model``, ``gen_ai.input.messages`` and
  ``gen_ai.output.messages`` (messages of ``parts``: ``text``, ``tool_call``,
  ``tool_call_response``), ``gen_ai.system_instructions``, ``gen_ai.tool.definitions``,
  ``gen_ai.conversation.id``, ``gen_ai.response.id``; and the older forms: the
  ``gen_ai.content.prompt`` / ``gen_ai.content.completion`` events (``gen_ai.prompt`` /
  ``gen_ai.completion``: chat messages as JSON) and the indexed attributes
  ``gen_ai.prompt.<i>.role`` / ``.content`` (OpenLLMetry).
- **OpenInference** (Phoenix, Arize): ``openinference.span.kind`` (``LLM``, ``AGENT``, ``TOOL``),
  ``llm.model_name``, ``llm.input_messages.<i>.message.role`` / ``.content`` /
  ``.tool_calls.<j>.tool_call.function.name`` / ``.arguments``, ``llm.output_messages...``,
  ``llm.tools.<i>.tool.json_schema``, ``session.id``, ``input.value`` / ``output.value``.

Messages come out as OpenAI chat messages, the form evalq's agent metrics read: ``{"role",
"content"}``, an assistant's ``tool_calls`` (``{"id", "type": "function", "function": {"name",
"arguments"}}``), a ``tool`` message's ``tool_call_id``. Pure functions of a span; no I/O.
"""

from __future__ import annotations

import json
import re
from typing import Any

from evalq.shared.agents.messages import text_of as content_text
from evalq.shared.traces.otlp import Span, SpanError

CHAT_OPERATIONS = {"chat", "text_completion", "generate_content"}


def kind(span: Span) -> str | None:
    """``chat``, ``agent``, ``tool`` for a GenAI span of either dialect, else None."""
    op = span.get("gen_ai.operation.name")
    if isinstance(op, str):
        if op in CHAT_OPERATIONS:
            return "chat"
        if op == "invoke_agent":
            return "agent"
        if op == "execute_tool":
            return "tool"
        return None  # embeddings, create_agent, ...: nothing to score
    oi = span.get("openinference.span.kind")
    if isinstance(oi, str):
        return {"LLM": "chat", "AGENT": "agent", "TOOL": "tool"}.get(oi.upper())
    if (span.get("gen_ai.system") or span.get("gen_ai.provider.name")) and _has_older_content(span):
        return "chat"  # before gen_ai.operation.name: a provider and a prompt
    return None


def model(span: Span) -> str | None:
    for key in ("gen_ai.response.model", "gen_ai.request.model", "llm.model_name"):
        if isinstance(span.get(key), str):
            return span.get(key)
    return None


def conversation(span: Span) -> str | None:
    for key in ("gen_ai.conversation.id", "session.id"):
        value = span.get(key)
        if isinstance(value, (str, int)) and value != "":
            return str(value)
    return None


def _has_older_content(span: Span) -> bool:
    return any(name in ("gen_ai.content.prompt", "gen_ai.content.completion") for name, _ in span.events) or \
        "gen_ai.prompt.0.role" in span.attributes or "gen_ai.prompt.0.content" in span.attributes


def _json(value: Any, what: str, where: str) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise SpanError(f"{where}: {what} is not JSON ({exc.msg})") from None
    return value


def _arguments_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value if value is not None else {}, ensure_ascii=False)


def _semconv_messages(raw: Any, what: str, where: str) -> list[dict]:
    """``gen_ai.input.messages`` / ``gen_ai.output.messages`` (messages of parts) as chat messages."""
    value = _json(raw, what, where)
    if not isinstance(value, list):
        raise SpanError(f"{where}: {what} must be a list of messages")
    out: list[dict] = []
    for i, msg in enumerate(value):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise SpanError(f"{where}: {what}[{i}] must be a message with a role")
        parts = msg.get("parts")
        if parts is None and "content" in msg:  # already a chat message
            out.append({k: v for k, v in msg.items() if k in ("role", "content", "tool_calls", "tool_call_id")})
            continue
        if not isinstance(parts, list):
            raise SpanError(f"{where}: {what}[{i}] must have a list of parts")
        texts, calls = [], []
        for j, part in enumerate(parts):
            ptype = part.get("type") if isinstance(part, dict) else None
            if ptype == "text":
                texts.append(str(part.get("content") or ""))
            elif ptype == "tool_call":
                calls.append({"id": part.get("id"), "type": "function", "function": {
                    "name": part.get("name"), "arguments": _arguments_text(part.get("arguments"))}})
            elif ptype == "tool_call_response":
                result = part.get("response", part.get("result"))
                out.append({"role": "tool", "tool_call_id": part.get("id"),
                            "content": result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)})
            elif not isinstance(part, dict):
                raise SpanError(f"{where}: {what}[{i}].parts[{j}] must be an object")
        if texts or calls or msg["role"] != "tool":
            message: dict = {"role": msg["role"], "content": "\n".join(texts) if texts else None}
            if calls:
                message["tool_calls"] = calls
            out.append(message)
    return out


_INDEXED = re.compile(r"^(llm\.(?:input|output)_messages|gen_ai\.(?:prompt|completion))\.(\d+)\.(.+)$")


def _indexed_messages(span: Span, prefix: str) -> list[dict]:
    """OpenInference's ``llm.input_messages.<i>.message.*`` or OpenLLMetry's ``gen_ai.prompt.<i>.*``."""
    found: dict[int, dict] = {}
    for key, value in span.attributes.items():
        m = _INDEXED.match(key)
        if not m or m.group(1) != prefix:
            continue
        rest = m.group(3).removeprefix("message.")
        msg = found.setdefault(int(m.group(2)), {})
        call = re.match(r"^tool_calls\.(\d+)\.(?:tool_call\.)?(.+)$", rest)
        part = re.match(r"^contents\.(\d+)\.message_content\.(.+)$", rest)
        if call:
            calls = msg.setdefault("_calls", {})
            one = calls.setdefault(int(call.group(1)), {})
            one[call.group(2).removeprefix("function.")] = value
        elif part:  # OpenInference's content of several parts (a question sent with an image)
            msg.setdefault("_contents", {}).setdefault(int(part.group(1)), {})[part.group(2)] = value
        elif rest in ("role", "content", "tool_call_id"):
            msg[rest] = value
    out = []
    for _, msg in sorted(found.items()):
        content = msg.get("content")
        if content is None and msg.get("_contents"):
            content = [_content_part(c) for _, c in sorted(msg["_contents"].items())]
        message = {"role": msg.get("role") or "user", "content": content}
        if msg.get("tool_call_id") is not None:
            message["tool_call_id"] = msg["tool_call_id"]
        if msg.get("_calls"):
            message["tool_calls"] = [{"id": c.get("id"), "type": "function", "function": {
                "name": c.get("name"), "arguments": _arguments_text(c.get("arguments"))}}
                for _, c in sorted(msg["_calls"].items())]
        out.append(message)
    return out


def _content_part(c: dict) -> dict:
    """An OpenInference ``message_content`` as OpenAI's content part: text, an image by its url, or
    another kind as it was recorded."""
    if c.get("type") == "text":
        return {"type": "text", "text": c.get("text")}
    if c.get("type") == "image" and "image.image.url" in c:
        return {"type": "image_url", "image_url": {"url": c["image.image.url"]}}
    return dict(c)


def _older_events(span: Span, where: str) -> tuple[list[dict], list[dict]]:
    prompt, completion = [], []
    for name, attrs in span.events:
        for event, key, into in (("gen_ai.content.prompt", "gen_ai.prompt", prompt),
                                 ("gen_ai.content.completion", "gen_ai.completion", completion)):
            if name == event and key in attrs:
                value = _json(attrs[key], f"event {event} {key}", where) if _looks_json(attrs[key]) else attrs[key]
                if isinstance(value, str):
                    into.append({"role": "assistant" if into is completion else "user", "content": value})
                elif isinstance(value, list):
                    into.extend(_semconv_messages(value, key, where))
                else:
                    raise SpanError(f"{where}: event {event} {key} must be messages or text")
    return prompt, completion


def _looks_json(value: Any) -> bool:
    return isinstance(value, str) and value[:1] in ("[", "{")


def messages(span: Span) -> tuple[list[dict], list[dict]]:
    """(input messages, output messages) of a chat span, as chat messages, from whichever form it
    carries them in; ``SpanError`` (located) when a form is present but unreadable."""
    where = span.where
    system = span.get("gen_ai.system_instructions")
    if "gen_ai.input.messages" in span.attributes or "gen_ai.output.messages" in span.attributes:
        inp = _semconv_messages(span.get("gen_ai.input.messages", "[]"), "gen_ai.input.messages", where)
        out = _semconv_messages(span.get("gen_ai.output.messages", "[]"), "gen_ai.output.messages", where)
        if system is not None:
            parts = _json(system, "gen_ai.system_instructions", where)
            text = "\n".join(str(p.get("content") or "") for p in parts if isinstance(p, dict)) \
                if isinstance(parts, list) else str(parts)
            inp = [{"role": "system", "content": text}, *inp]
        return inp, out
    inp, out = _older_events(span, where)
    if inp or out:
        return inp, out
    for pin, pout in (("llm.input_messages", "llm.output_messages"), ("gen_ai.prompt", "gen_ai.completion")):
        inp, out = _indexed_messages(span, pin), _indexed_messages(span, pout)
        if inp or out:
            return inp, [{**m, "role": m.get("role") or "assistant"} for m in out]
    if isinstance(span.get("input.value"), str):  # OpenInference's plain values
        return [{"role": "user", "content": span.get("input.value")}], \
            ([{"role": "assistant", "content": span.get("output.value")}] if isinstance(span.get("output.value"), str) else [])
    return [], []


def tool_definitions(span: Span) -> list | None:
    """The tools the model was offered (OpenAI's ``{"type": "function", "function": {...}}``)."""
    raw = span.get("gen_ai.tool.definitions")
    if raw is not None:
        value = _json(raw, "gen_ai.tool.definitions", span.where)
        return value if isinstance(value, list) else None
    found = {}
    for key, value in span.attributes.items():
        m = re.match(r"^llm\.tools\.(\d+)\.tool\.json_schema$", key)
        if m:
            found[int(m.group(1))] = _json(value, key, span.where)
    return [v for _, v in sorted(found.items())] or None


def text_of(msg: dict | None) -> str | None:
    """A chat message's text: its content when a string, else its text parts (OpenAI's content
    parts, in which a call with an image, say, is sent and recorded), as agent records are read."""
    return content_text((msg or {}).get("content"))


def _answer(out: list[dict]) -> str | None:
    """The text of the last assistant message that has one."""
    return next((text_of(m) for m in reversed(out) if m.get("role") == "assistant" and text_of(m)), None)


def trace_fields(span: Span) -> dict:
    """What an instance keeps of its span: where its scores go back to (``trace_id``, ``span_id``)
    and what filters and reports name."""
    fields = {"trace_id": span.trace_id, "span_id": span.span_id, "name": span.name,
              "start_ns": span.start}
    for key, value in (("service", span.service), ("model", model(span)), ("conversation_id", conversation(span)),
                       ("response_id", span.get("gen_ai.response.id"))):
        if value is not None:
            fields[key] = value
    return fields


def chat_instance(span: Span) -> dict | None:
    """A chat span as an instance: its last user message the ``input``, its answer's text the
    ``actual-output``, the conversation it was sent as ``messages``; None when the answer has no
    text (a turn that only called tools: its agent run is scored instead)."""
    inp, out = messages(span)
    answer = _answer(out)
    if answer is None:
        return None
    question = next((text_of(m) for m in reversed(inp) if m.get("role") == "user" and text_of(m) is not None), None)
    inst: dict = {"id": span.span_id, "actual-output": answer, "otel": trace_fields(span)}
    if question is not None:
        inst["input"] = question
    return inst


def conversation_messages(calls: list[Span]) -> list[dict]:
    """A conversation's messages from its model calls, in the order they started: each call adds what
    it was sent that the conversation does not end with yet (the whole history, a window of it, or
    only its own turn, as applications send them), then its answer."""
    convo: list[dict] = []
    for call in calls:
        inp, out = messages(call)
        sent = [m for m in inp if m.get("role") != "system"] if convo else inp
        # what the call was sent that the conversation already has: its tail (all of it, a window of
        # it, or nothing when each call carries only its own turn)
        seen = next((k for k in range(min(len(convo), len(sent)), 0, -1) if convo[-k:] == sent[:k]), 0)
        convo = [*convo, *sent[seen:], *out]
    return convo


def run_instance(root: Span, chats: list[Span], tools: list[Span]) -> dict | None:
    """An agent's run under one trace as one instance (the agent metrics score it): the
    conversation the last model call was sent and answered, with the tools it was offered;
    where that conversation lacks the calls, they come from the ``execute_tool`` spans."""
    if not chats:
        return None
    last = max(chats, key=lambda s: (s.end, s.start))
    inp, out = messages(last)
    convo = [*inp, *out]
    if not any(m.get("tool_calls") for m in convo) and tools:
        convo = _with_tool_spans(convo, sorted(tools, key=lambda s: s.start))
    inst: dict = {"id": root.span_id, "messages": convo, "otel": {**trace_fields(root), "model": model(last)}}
    defs = next((d for d in (tool_definitions(s) for s in sorted(chats, key=lambda s: -s.end)) if d), None)
    if defs:
        inst["tool_definitions"] = defs
    answer = _answer(out)
    if answer is not None:
        inst["actual-output"] = answer
    question = next((text_of(m) for m in convo if m.get("role") == "user" and text_of(m) is not None), None)
    if question is not None:
        inst["input"] = question
    if inst["otel"].get("model") is None:
        inst["otel"].pop("model")
    return inst


def _with_tool_spans(convo: list[dict], tools: list[Span]) -> list[dict]:
    """The calls an agent made, from its ``execute_tool`` (or OpenInference ``TOOL``) spans,
    put before its final answer."""
    calls, results = [], []
    for n, s in enumerate(tools):
        call_id = s.get("gen_ai.tool.call.id") or s.get("tool_call.id") or f"call_{n}"
        name = s.get("gen_ai.tool.name") or s.get("tool.name") or s.name
        arguments = s.get("gen_ai.tool.call.arguments", s.get("tool.parameters", s.get("input.value", {})))
        result = s.get("gen_ai.tool.call.result", s.get("output.value"))
        calls.append({"role": "assistant", "content": None, "tool_calls": [{"id": str(call_id), "type": "function",
                      "function": {"name": name, "arguments": _arguments_text(arguments)}}]})
        results.append({"role": "tool", "tool_call_id": str(call_id),
                        "content": result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)})
    steps = [m for pair in zip(calls, results) for m in pair]
    final = len(convo) - 1 if convo and convo[-1].get("role") == "assistant" else len(convo)
    return [*convo[:final], *steps, *convo[final:]]
