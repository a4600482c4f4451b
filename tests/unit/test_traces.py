"""OTLP JSON spans and GenAI attributes read as evalq does (issue 41): the forms a real export
holds that the SDK-made spans in tests/integration/test_otlp_traces.py do not (base64 ids, typed
values, OpenInference's and OpenLLMetry's indexed messages with tool calls), and where a bad span
is said to be."""

from __future__ import annotations

import base64
import json

import pytest

from evalq.shared.traces import genai
from evalq.shared.traces.otlp import SpanError, spans_of
from evalq.shared.traces.select import TraceSelection, sampled

TRACE, SPAN = "5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174"


def kv(key, value):
    kind = {str: "stringValue", bool: "boolValue", int: "intValue", float: "doubleValue"}[type(value)]
    return {"key": key, "value": {kind: str(value) if kind == "intValue" else value}}


def request(*spans, service="svc"):
    return {"resourceSpans": [{"resource": {"attributes": [kv("service.name", service)]},
                               "scopeSpans": [{"scope": {"name": "s"}, "spans": list(spans)}]}]}


def span(attrs, **extra):
    return {"traceId": TRACE, "spanId": SPAN, "name": "llm", "startTimeUnixNano": "1700000000000000000",
            "endTimeUnixNano": "1700000001000000000", "attributes": attrs, **extra}


def test_values_ids_and_events_are_read_as_python():
    raw = span([kv("n", 3), kv("x", 0.5), kv("ok", True),
                {"key": "list", "value": {"arrayValue": {"values": [{"stringValue": "a"}, {"intValue": 2}]}}},
                {"key": "map", "value": {"kvlistValue": {"values": [kv("k", "v")]}}}],
               traceId=base64.b64encode(bytes.fromhex(TRACE)).decode())  # protobuf's JSON mapping: base64
    (s,) = spans_of(request(raw), "f line 1")
    assert (s.trace_id, s.span_id, s.service) == (TRACE, SPAN, "svc")
    assert s.attributes == {"n": 3, "x": 0.5, "ok": True, "list": ["a", 2], "map": {"k": "v"}}


@pytest.mark.parametrize("bad,message", [
    ({"spanId": "xyz"}, "spanId must be 16 hex digits"),
    ({"attributes": [{"key": "a", "value": {"weirdValue": 1}}]}, "unknown AnyValue kind 'weirdValue'"),
    ({"attributes": [{"key": "n", "value": {"intValue": "ten"}}]}, "intValue 'ten' is not an integer"),
    ({"startTimeUnixNano": "soon"}, "startTimeUnixNano must be nanoseconds"),
])
def test_a_bad_span_is_located_and_the_others_still_read(bad, message):
    good = span([kv("gen_ai.operation.name", "chat")])
    out = list(spans_of(request(span([], **bad), good), "traces.jsonl line 7"))
    assert isinstance(out[0], SpanError) and message in str(out[0])
    assert str(out[0]).startswith("traces.jsonl line 7 resourceSpans[0].scopeSpans[0].spans[0]")
    assert not isinstance(out[1], SpanError) and genai.kind(out[1]) == "chat"


def test_openinference_messages_with_tool_calls():
    attrs = [kv("openinference.span.kind", "LLM"), kv("llm.model_name", "m"),
             kv("llm.input_messages.0.message.role", "user"), kv("llm.input_messages.0.message.content", "hi"),
             kv("llm.output_messages.0.message.role", "assistant"),
             kv("llm.output_messages.0.message.tool_calls.0.tool_call.function.name", "search"),
             kv("llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments", '{"q": "x"}'),
             kv("llm.output_messages.0.message.tool_calls.0.tool_call.id", "t1"),
             kv("llm.tools.0.tool.json_schema", json.dumps({"type": "function", "function": {"name": "search"}}))]
    (s,) = spans_of(request(span(attrs)), "f")
    inp, out = genai.messages(s)
    assert inp == [{"role": "user", "content": "hi"}]
    assert out == [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "t1", "type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}}]}]
    assert genai.tool_definitions(s) == [{"type": "function", "function": {"name": "search"}}]
    assert genai.chat_instance(s) is None  # only tool calls: its agent run is scored, not this call


def test_openllmetry_indexed_prompt_and_completion():
    attrs = [kv("gen_ai.system", "openai"), kv("gen_ai.request.model", "gpt-4"),
             kv("gen_ai.prompt.0.role", "system"), kv("gen_ai.prompt.0.content", "be kind"),
             kv("gen_ai.prompt.1.role", "user"), kv("gen_ai.prompt.1.content", "hello"),
             kv("gen_ai.completion.0.role", "assistant"), kv("gen_ai.completion.0.content", "hi there")]
    (s,) = spans_of(request(span(attrs)), "f")
    assert genai.kind(s) == "chat"
    inst = genai.chat_instance(s)
    assert (inst["input"], inst["actual-output"], inst["otel"]["model"]) == ("hello", "hi there", "gpt-4")


PARTS_IN = [{"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "What is on the sign?"},
                                         {"type": "image_url", "image_url": {"url": "https://x/sign.png"}}]}]
PARTS_OUT = [{"role": "assistant", "content": [{"type": "text", "text": "It says"}, {"type": "text", "text": "STOP"}]}]


@pytest.mark.parametrize("form", ["semconv", "older events"])
def test_messages_whose_content_is_openai_parts_give_their_text(form):
    """A call sent with an image (OpenAI's content parts) is still a question and an answer: their
    text parts, as an agent record's are read (evalq.shared.agents.messages), not a call without text."""
    if form == "semconv":
        raw = span([kv("gen_ai.operation.name", "chat"), kv("gen_ai.input.messages", json.dumps(PARTS_IN)),
                    kv("gen_ai.output.messages", json.dumps(PARTS_OUT))])
    else:
        raw = span([kv("gen_ai.system", "openai")], events=[
            {"name": "gen_ai.content.prompt", "timeUnixNano": "1700000000000000001",
             "attributes": [kv("gen_ai.prompt", json.dumps(PARTS_IN))]},
            {"name": "gen_ai.content.completion", "timeUnixNano": "1700000000000000002",
             "attributes": [kv("gen_ai.completion", json.dumps(PARTS_OUT))]}])
    (s,) = spans_of(request(raw), "f")
    inst = genai.chat_instance(s)
    assert (inst["input"], inst["actual-output"]) == ("What is on the sign?", "It says\nSTOP")
    assert genai.messages(s) == (PARTS_IN, PARTS_OUT)  # the messages themselves as they were sent


def test_unreadable_messages_are_a_located_problem():
    (s,) = spans_of(request(span([kv("gen_ai.operation.name", "chat"), kv("gen_ai.input.messages", "[{oops")])),
                    "f line 2")
    with pytest.raises(SpanError, match=r"f line 2 .*gen_ai.input.messages is not JSON"):
        genai.messages(s)


def test_sampling_rule_and_filters():
    assert sampled("0" * 16 + "0" * 16, 0.01) and not sampled("f" * 32, 0.99) and sampled("f" * 32, 1.0)
    assert not sampled("0" * 32, 0.0)
    (s,) = spans_of(request(span([kv("gen_ai.operation.name", "chat"), kv("gen_ai.request.model", "gpt-4o"),
                                  kv("env", "prod")])), "f")
    assert TraceSelection(models=["gpt-4*"], attributes={"env": "prod"}).verdict(s, "chat") == "kept"
    assert TraceSelection(models=["claude*"]).verdict(s, "chat") == "filtered"
    assert TraceSelection(services=["other"]).verdict(s, "chat") == "filtered"
    assert TraceSelection(until="2023-01-01T00:00:00Z").verdict(s, "chat") == "filtered"  # it started Nov 2023
    with pytest.raises(ValueError, match="time zone"):
        TraceSelection(since="2026-11-25T00:00:00")


def test_evaluation_events_of_a_rating_a_defect_and_an_object():
    """What each record sends (gen_ai.evaluation.result's attributes), read as results.json reads it."""
    from evalq.shared.traces.events import evaluations

    otel = {"trace_id": TRACE, "span_id": SPAN, "response_id": "chatcmpl-1"}
    (ev,) = evaluations("j", "fluency@0", "fluency", "rating", {"threshold": 4}, 3,
                        {"instance_id": SPAN, "result": {"score": 3, "reason": "choppy"}}, otel)
    assert (ev.name, ev.value, ev.label, ev.explanation, ev.span_id) == ("fluency", 3.0, "fail", "choppy", SPAN)
    attrs = ev.attributes("j", "fluency@0")
    assert attrs["gen_ai.response.id"] == "chatcmpl-1" and "evalq.instance.id" not in attrs
    assert attrs["evalq.event.id"] == "j:fluency@0:3:mean"
    (ev,) = evaluations("j", "violence@1", "violence", "defect", {"threshold": 4}, 0,
                        {"instance_id": "x", "result": {"severity": 5, "reason": "graphic"}}, None)
    assert (ev.value, ev.label, ev.span_id) == (5.0, "medium", None)
    assert ev.attributes("j", "violence@1")["evalq.instance.id"] == "x"
    evs = evaluations("j", "rouge@2", "rouge", "mean", {}, 0, {"instance_id": "x", "result": {"rouge1": 0.5, "rougeL": 0.25}}, None)
    assert {(e.name, e.value, e.label) for e in evs} == {("rouge.rouge1", 0.5, None), ("rouge.rougeL", 0.25, None)}
    assert evaluations("j", "k", "k", "mean", {}, 0, {"instance_id": "x", "error": "ValueError: no"}, None) == []
    assert evaluations("j", "k", "k", "mean", {}, 0, {"instance_id": "x", "not_applicable": "no refs"}, None) == []


@pytest.mark.parametrize("sent", ["history", "window", "own turn"])
def test_a_conversation_is_every_turn_however_each_call_was_sent_it(sent):
    """Applications send a model call the whole history, a window of it, or only the new turn."""
    turns = [("user", f"q{k}") if k % 2 == 0 else ("assistant", f"a{k // 2}") for k in range(6)]
    calls = []
    for k in range(3):
        upto = [{"role": r, "content": c} for r, c in turns[:2 * k + 1]]
        inp = {"history": upto, "window": upto[-3:], "own turn": upto[-1:]}[sent]
        attrs = [kv("gen_ai.operation.name", "chat"), kv("gen_ai.conversation.id", "c"),
                 kv("gen_ai.input.messages", json.dumps([{"role": "system", "content": "sys"}, *inp])),
                 kv("gen_ai.output.messages", json.dumps([{"role": "assistant", "content": f"a{k}"}]))]
        (s,) = spans_of(request(span(attrs, spanId=f"{k:016x}", startTimeUnixNano=str(10 + k))), "f")
        calls.append(s)
    convo = genai.conversation_messages(calls)
    assert convo == [{"role": "system", "content": "sys"}] + [{"role": r, "content": c} for r, c in turns]
