"""Issue 41: spans that real instrumentations made, not spans written by hand. An application calls
an OpenAI-compatible server (judge-sim, on loopback) through the openai SDK, instrumented once by
OpenTelemetry's own OpenAI instrumentation (the GenAI conventions, message content on the span) and
once by OpenInference's (Phoenix's dialect); the SDK's JSON file exporter writes the spans as a
Collector would. evalq reads each file back: one instance per call, its input the question the app
sent, its answer what the app received, its ids the span's."""

from __future__ import annotations

import json
import uuid

import pytest

pytest.importorskip("opentelemetry.instrumentation.openai_v2")
pytest.importorskip("openinference.instrumentation.openai")

import openai  # noqa: E402

from evalq.sim import JudgeSim, Region  # noqa: E402
from tests.integration.test_otlp_traces import load, provider  # noqa: E402

pytestmark = pytest.mark.integration

KEY = "sk-sim-" + uuid.uuid4().hex
QUESTIONS = ["Is the store open on Sunday?", "How long does delivery to Porto take?", "Can I pay by invoice?"]


@pytest.fixture(scope="module")
def server():
    with JudgeSim([Region("app")], api_key=KEY, seed=3) as sim:
        yield sim


def app(server, path, instrumentor, service, content=lambda q: q):
    """The instrumented application: three questions, the answers it got back (and their ids);
    ``content`` makes a question's message content (a string, or OpenAI's content parts)."""
    tp = provider(path, service)
    instrumentor.instrument(tracer_provider=tp)
    try:
        client = openai.OpenAI(base_url=server.base_url("app"), api_key=KEY, max_retries=0)
        got = []
        for q in QUESTIONS:
            reply = client.chat.completions.create(model="judge-sim", max_tokens=60,
                                                   messages=[{"role": "system", "content": "You help shoppers."},
                                                             {"role": "user", "content": content(q)}])
            got.append((q, reply.choices[0].message.content, reply.id))
    finally:
        instrumentor.uninstrument()
        tp.shutdown()
    return got


def check(tmp_path, got, model_key="model"):
    job = load(tmp_path / "traces")
    by_input = {inst["input"]: inst for inst in job.instances}
    assert len(job.instances) == len(QUESTIONS) == len(by_input)
    for q, answer, _ in got:
        assert by_input[q]["actual-output"] == answer
        assert len(by_input[q]["otel"]["trace_id"]) == 32 and by_input[q]["id"] == by_input[q]["otel"]["span_id"]
    return by_input


def test_opentelemetrys_openai_instrumentation(server, tmp_path, monkeypatch):
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "span_only")
    (tmp_path / "traces").mkdir()
    got = app(server, tmp_path / "traces" / "app.jsonl", OpenAIInstrumentor(), "shop-otel")
    by_input = check(tmp_path, got)
    for q, _, reply_id in got:
        assert by_input[q]["otel"]["response_id"] == reply_id and by_input[q]["otel"]["service"] == "shop-otel"


def test_openinferences_openai_instrumentation(server, tmp_path):
    from openinference.instrumentation.openai import OpenAIInstrumentor

    (tmp_path / "traces").mkdir()
    got = app(server, tmp_path / "traces" / "app.jsonl", OpenAIInstrumentor(), "shop-oi")
    by_input = check(tmp_path, got)
    assert {inst["otel"]["model"] for inst in by_input.values()} == {"judge-sim"}


def test_openinferences_spans_of_a_question_sent_with_an_image(server, tmp_path):
    """OpenInference records a message of several content parts as ``message.contents.<j>.message_content``
    (a text part, an image part): the question is its text part, the conversation keeps both parts."""
    from openinference.instrumentation.openai import OpenAIInstrumentor

    from evalq.shared.traces import genai
    from evalq.shared.traces.otlp import spans_of

    photo = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    (tmp_path / "traces").mkdir()
    got = app(server, tmp_path / "traces" / "app.jsonl", OpenAIInstrumentor(), "shop-oi",
              content=lambda q: [{"type": "text", "text": q}, photo])
    check(tmp_path, got)  # every question read from its text part, with its answer
    lines = (tmp_path / "traces" / "app.jsonl").read_text().splitlines()
    spans = [s for n, line in enumerate(lines, 1) for s in spans_of(json.loads(line), f"app.jsonl line {n}")]
    sent = [m for s in spans for m in genai.messages(s)[0] if m["role"] == "user"]
    assert sent == [{"role": "user", "content": [{"type": "text", "text": q}, photo]} for q in QUESTIONS]


@pytest.mark.parametrize("grouped", [True, False], ids=["with-the-processor", "without"])
def test_an_openai_v2_application_groups_its_turns_into_one_conversation(server, tmp_path, monkeypatch, grouped):
    """Issue 60: a gen_ai.conversation.id on a parent span left three turns as three instances. The
    docs' span processor (examples/otel_conversation_id.py) puts the id on each call's span."""
    import runpy

    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

    from tests.conftest import ROOT

    recipe = runpy.run_path(str(ROOT / "examples" / "otel_conversation_id.py"))
    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "span_only")
    (tmp_path / "traces").mkdir()
    tp = provider(tmp_path / "traces" / "app.jsonl", "shop-chat")
    if grouped:
        tp.add_span_processor(recipe["ConversationId"]())
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=tp)
    try:
        client = openai.OpenAI(base_url=server.base_url("app"), api_key=KEY, max_retries=0)
        history = [{"role": "system", "content": "You help shoppers."}]
        with recipe["in_conversation"]("chat-42"):
            for q in QUESTIONS:  # each turn sent with the conversation so far, as chat apps do
                history.append({"role": "user", "content": q})
                reply = client.chat.completions.create(model="judge-sim", max_tokens=60, messages=history)
                history.append({"role": "assistant", "content": reply.choices[0].message.content})
    finally:
        instrumentor.uninstrument()
        tp.shutdown()
    job = load(tmp_path / "traces")
    if not grouped:
        assert len(job.instances) == len(QUESTIONS)  # what the issue saw: three instances
        return
    [conversation] = job.instances
    assert conversation["otel"]["conversation_id"] == "chat-42"
    assert [m["content"] for m in conversation["messages"] if m["role"] != "system"] == \
        [m["content"] for m in history[1:]]
