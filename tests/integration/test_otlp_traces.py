"""Issue 41: production traces as a dataset. Spans made by the OpenTelemetry SDK with GenAI
attributes (the semantic conventions, their older prompt/completion events, and OpenInference's
attributes) are exported to OTLP JSON by the SDK's own file exporter, the format a Collector's file
exporter writes, then read back by evalq: chat spans, an agent's run under one trace, a
conversation, spans that are not GenAI (passed by, counted), a malformed line (located), gzip and
folders, a sample by trace id equal to the SDK's own sampler, and filters. Scored end to end on a
real cluster."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import shutil

import pytest

pytest.importorskip("opentelemetry.exporter.otlp.json.file")

from opentelemetry.exporter.otlp.json.file import FileSpanExporter  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.id_generator import IdGenerator  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased  # noqa: E402

from evalq.cli.run import run_job  # noqa: E402
from evalq.shared.core.errors import JobError  # noqa: E402
from evalq.shared.job.schema import parse_job  # noqa: E402
from tests.conftest import evalq, read_log, read_results  # noqa: E402

pytestmark = pytest.mark.integration


class SeededIds(IdGenerator):
    """The SDK's random ids from a seeded generator: every run of the suite samples the same traces."""

    def __init__(self, seed: str):
        self.rng = random.Random(seed)

    def generate_span_id(self) -> int:
        return self.rng.getrandbits(64)

    def generate_trace_id(self) -> int:
        return self.rng.getrandbits(128)


def provider(path, service: str) -> TracerProvider:
    tp = TracerProvider(resource=Resource.create({"service.name": service}), id_generator=SeededIds(service))
    tp.add_span_processor(SimpleSpanProcessor(FileSpanExporter(path=str(path))))
    return tp


def chat(tracer, question: str, answer: str, model: str = "gpt-4o-mini", **extra):
    """A chat span as the GenAI conventions describe it (messages of parts, JSON in attributes)."""
    with tracer.start_as_current_span(f"chat {model}") as span:
        span.set_attribute("gen_ai.operation.name", "chat")
        span.set_attribute("gen_ai.provider.name", "openai")
        span.set_attribute("gen_ai.request.model", model)
        span.set_attribute("gen_ai.input.messages", json.dumps(
            [{"role": "user", "parts": [{"type": "text", "content": question}]}]))
        span.set_attribute("gen_ai.output.messages", json.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": answer}], "finish_reason": "stop"}]))
        for k, v in extra.items():
            span.set_attribute(k, v)
        return span.get_span_context()


def older_chat(tracer, question: str, answer: str):
    """The older form: the prompt and the completion as span events."""
    with tracer.start_as_current_span("openai.chat") as span:
        span.set_attribute("gen_ai.system", "openai")
        span.set_attribute("gen_ai.request.model", "gpt-3.5-turbo")
        span.add_event("gen_ai.content.prompt", {"gen_ai.prompt": json.dumps([{"role": "user", "content": question}])})
        span.add_event("gen_ai.content.completion",
                       {"gen_ai.completion": json.dumps([{"role": "assistant", "content": answer}])})
        return span.get_span_context()


def openinference_chat(tracer, question: str, answer: str):
    with tracer.start_as_current_span("ChatCompletion") as span:
        span.set_attribute("openinference.span.kind", "LLM")
        span.set_attribute("llm.model_name", "claude-x")
        span.set_attribute("llm.input_messages.0.message.role", "system")
        span.set_attribute("llm.input_messages.0.message.content", "be brief")
        span.set_attribute("llm.input_messages.1.message.role", "user")
        span.set_attribute("llm.input_messages.1.message.content", question)
        span.set_attribute("llm.output_messages.0.message.role", "assistant")
        span.set_attribute("llm.output_messages.0.message.content", answer)
        return span.get_span_context()


def agent_run(tracer, calls: list[tuple[str, dict]], answer: str):
    """An agent: invoke_agent over a model call that asks for tools, execute_tool spans, and a
    last model call sent the whole conversation."""
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n, _ in calls]
    with tracer.start_as_current_span("invoke_agent helper") as root:
        root.set_attribute("gen_ai.operation.name", "invoke_agent")
        root.set_attribute("gen_ai.agent.name", "helper")
        history = [{"role": "user", "parts": [{"type": "text", "content": "plan my day"}]}]
        asked = {"role": "assistant", "parts": [{"type": "tool_call", "id": f"c{i}", "name": n, "arguments": a}
                                                for i, (n, a) in enumerate(calls)]}
        with tracer.start_as_current_span("chat m") as span:
            span.set_attribute("gen_ai.operation.name", "chat")
            span.set_attribute("gen_ai.request.model", "m")
            span.set_attribute("gen_ai.input.messages", json.dumps(history))
            span.set_attribute("gen_ai.output.messages", json.dumps([asked]))
            span.set_attribute("gen_ai.tool.definitions", json.dumps(tools))
        results = []
        for i, (n, a) in enumerate(calls):
            with tracer.start_as_current_span(f"execute_tool {n}") as span:
                span.set_attribute("gen_ai.operation.name", "execute_tool")
                span.set_attribute("gen_ai.tool.name", n)
                span.set_attribute("gen_ai.tool.call.id", f"c{i}")
            results.append({"role": "tool", "parts": [{"type": "tool_call_response", "id": f"c{i}", "response": "ok"}]})
        with tracer.start_as_current_span("chat m") as span:
            span.set_attribute("gen_ai.operation.name", "chat")
            span.set_attribute("gen_ai.request.model", "m")
            span.set_attribute("gen_ai.input.messages", json.dumps([*history, asked, *results]))
            span.set_attribute("gen_ai.output.messages", json.dumps(
                [{"role": "assistant", "parts": [{"type": "text", "content": answer}]}]))
            span.set_attribute("gen_ai.tool.definitions", json.dumps(tools))
        return root.get_span_context()


def not_genai(tracer):
    with tracer.start_as_current_span("GET /health") as span:
        span.set_attribute("http.request.method", "GET")


def hexes(ctx) -> tuple[str, str]:
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


@pytest.fixture
def exported(tmp_path):
    """A night of an app's traces, as the SDK's file exporter writes them (one request per line)."""
    path = tmp_path / "traces" / "part-0.jsonl"
    path.parent.mkdir()
    tp = provider(path, "checkout")
    tracer = tp.get_tracer("app")
    made = {"chat": [], "older": [], "oi": [], "conv": []}
    for i in range(6):
        made["chat"].append((hexes(chat(tracer, f"what is {i}+{i}?", f"{2 * i}")), f"what is {i}+{i}?", f"{2 * i}"))
        not_genai(tracer)
    made["older"].append((hexes(older_chat(tracer, "capital of France?", "Paris")), "capital of France?", "Paris"))
    made["oi"].append((hexes(openinference_chat(tracer, "2+2?", "4")), "2+2?", "4"))
    for turn in range(3):
        made["conv"].append(hexes(chat(tracer, f"turn {turn}", f"answer {turn}", **{"gen_ai.conversation.id": "conv-1"})))
    made["run"] = hexes(agent_run(tracer, [("weather", {"city": "Lisbon"}), ("calendar", {"day": "mon"})], "done"))
    tp.shutdown()
    other = provider(tmp_path / "traces" / "part-1.jsonl", "search")
    for i in range(4):
        made["chat"].append((hexes(chat(other.get_tracer("s"), f"find {i}", f"found {i}", model="gpt-4o")),
                             f"find {i}", f"found {i}"))
    other.shutdown()
    return tmp_path / "traces", made


def load(uri, metrics=None, **traces):
    """The job's instances as evalq reads them (slow_len, a test plugin, needs only an answer)."""
    return parse_job({"dataset": {"uri": str(uri), "format": "otlp", **({"traces": traces} if traces else {})},
                      "metrics": metrics or [{"id": "slow_len", "parameters": {"seconds": 0}}]})


def test_spans_of_both_dialects_become_instances_with_their_ids(exported):
    folder, made = exported
    job = load(folder)
    by_id = {inst["id"]: inst for inst in job.instances}
    for (trace, span), question, answer in made["chat"] + made["older"] + made["oi"]:
        inst = by_id[span]
        assert (inst["input"], inst["actual-output"]) == (question, answer)
        assert (inst["otel"]["trace_id"], inst["otel"]["span_id"]) == (trace, span)
    # the conversation: one instance, on its last span, with every turn's messages
    last = made["conv"][-1][1]
    assert not {s for _, s in made["conv"][:-1]} & by_id.keys()
    texts = [m["content"] for m in by_id[last]["messages"]]
    # each call here was sent only its own turn: the conversation is every turn, in order
    assert texts == ["turn 0", "answer 0", "turn 1", "answer 1", "turn 2", "answer 2"]
    assert by_id[last]["otel"]["conversation_id"] == "conv-1"
    # the agent's run: one instance on its invoke_agent span, with its calls and results, by trajectory
    run = by_id[made["run"][1]]
    calls = [tc["function"]["name"] for m in run["messages"] for tc in m.get("tool_calls") or []]
    assert calls == ["weather", "calendar"] and run["actual-output"] == "done"
    assert [t["function"]["name"] for t in run["tool_definitions"]] == ["weather", "calendar"]
    assert len(job.instances) == 10 + 1 + 1 + 1 + 1
    assert job.spans["not_genai"] == 6 and job.spans["files"] == 2
    assert job.spans["instances"] == {"span": 12, "conversation": 1, "run": 1}
    assert by_id[made["chat"][-1][0][1]]["otel"]["service"] == "search"


def test_sample_by_trace_id_is_the_sdks_own_and_grows_with_the_rate(exported):
    folder, made = exported
    spans = {s for (_, s), _, _ in made["chat"]}
    chosen = {}
    for rate in (0.0, 0.3, 0.6, 1.0):
        job = load(folder, sample_rate=rate, services=["checkout", "search"], span_names=["chat *"]) \
            if rate else None
        chosen[rate] = {i["id"] for i in job.instances} & spans if job else set()
        sampler = TraceIdRatioBased(rate)
        expected = {s for (t, s), _, _ in made["chat"]
                    if sampler.should_sample(None, int(t, 16), "x").decision.is_sampled()}
        assert chosen[rate] == expected, rate
        if rate:  # the same rate chooses the same traces again
            assert {i["id"] for i in load(folder, sample_rate=rate, services=["checkout", "search"],
                                          span_names=["chat *"]).instances} & spans == chosen[rate]
    assert chosen[0.3] <= chosen[0.6] <= chosen[1.0] and chosen[1.0] == spans
    # a conversation's turns (each its own trace here) are decided by its id: in or out whole
    from evalq.shared.traces.select import sampled

    conv_key = hashlib.sha256(b"conv-1").hexdigest()[:32]
    for rate in (0.2, 0.4, 0.6, 0.8):
        ids = {i["id"] for i in load(folder, sample_rate=rate).instances}
        assert (made["conv"][-1][1] in ids) is sampled(conv_key, rate)
        assert not {s for _, s in made["conv"][:-1]} & ids


def test_filters_on_service_model_time_and_attributes(exported):
    folder, made = exported
    search = {s for (_, s), q, _ in made["chat"] if q.startswith("find")}
    assert {i["id"] for i in load(folder, services=["sea*"]).instances} == search
    assert {i["id"] for i in load(folder, models=["gpt-4o"]).instances} == search
    job = load(folder, attributes={"gen_ai.conversation.id": "conv-1"})
    assert [i["id"] for i in job.instances] == [made["conv"][-1][1]]
    with pytest.raises(JobError, match="no GenAI spans to score"):
        load(folder, since="2999-01-01T00:00:00Z")
    assert len(load(folder, until="2999-01-01T00:00:00Z", since="-1h").instances) == 14
    # every chat span alone: the conversation's three turns, the agent's two model calls
    assert len(load(folder, unit="span").instances) == 12 + 3 + 1


def test_gzip_glob_and_a_malformed_line_located(exported, tmp_path):
    folder, _ = exported
    packed = tmp_path / "packed"
    packed.mkdir()
    for part in folder.iterdir():
        with open(part, "rb") as f, gzip.open(packed / (part.name + ".gz"), "wb") as g:
            shutil.copyfileobj(f, g)
    assert len(load(f"{packed}/*.jsonl.gz").instances) == 14
    # a Collector that retried an export: the same spans twice, scored once
    shutil.copy(packed / "part-1.jsonl.gz", packed / "part-1-retried.jsonl.gz")
    job = load(f"{packed}/*.jsonl.gz")
    assert len(job.instances) == 14 and job.spans["repeated"] == 4
    (packed / "part-1-retried.jsonl.gz").unlink()
    # alternatives, as a nightly job names two days' partitions; one with nothing in it is passed by
    assert len(load(f"{packed}/{{part-0,part-1,part-9}}.jsonl.gz").instances) == 14
    assert len(load(f"{packed}/{{part-1,nothing}}*").instances) == 4
    broken = packed / "part-2.jsonl"
    broken.write_text('{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz", "spanId": "01"}]}]}]}\n'
                      "not json\n")
    with pytest.raises(JobError) as err:
        load(packed)
    text = str(err.value)
    assert f"{broken} line 1 resourceSpans[0].scopeSpans[0].spans[0]" in text and "traceId must be 32 hex" in text
    assert f"{broken} line 2" in text and "not JSON" in text


def test_a_night_of_traces_scored_on_a_cluster(exported, redis_url, cpu_worker, tmp_path):
    folder, made = exported
    # exact_match needs references, which production traces do not have: not applicable, not errors
    job = load(folder, [{"id": "slow_len", "parameters": {"seconds": 0}}, {"id": "exact_match"}], sample_rate=0.6)
    run_job(job, tmp_path / "out", broker=redis_url, progress=False, stall_timeout=120)
    answers = {s: a for (_, s), _, a in made["chat"] + made["older"] + made["oi"]}
    answers[made["conv"][-1][1]], answers[made["run"][1]] = "answer 2", "done"
    kept = {inst["id"] for inst in job.instances}
    lines = read_log(tmp_path / "out")
    log = {line["instance_id"]: line["result"] for line in lines if line["metric"] == "slow_len"}
    assert log == {s: len(a) for s, a in answers.items() if s in kept} and 0 < len(log) < 14
    # each line carries its span's ids (issue 60: lines carried only the span id, as instance_id)
    traces = {span: trace for (trace, span), _, _ in made["chat"] + made["older"] + made["oi"]}
    for line in lines:
        assert line["otel"]["span_id"] == line["instance_id"] and "start_ns" in line["otel"], line
        if line["instance_id"] in traces:
            assert line["otel"]["trace_id"] == traces[line["instance_id"]] and line["otel"]["service"], line
    unscored = [line for line in lines if line["metric"] == "exact_match"]
    assert len(unscored) == len(log)
    assert all(line["not_applicable"] == "the span has no 'expected-output'" for line in unscored)
    assert read_results(tmp_path / "out")["exact_match"]["n_not_applicable"] == len(log)
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["dataset"]["format"] == "otlp" and run["dataset"]["spans"]["spans"] == 6 + 6 + 1 + 1 + 3 + 5 + 4
    assert run["dataset"]["spans"]["sampled_out"] > 0
    assert read_results(tmp_path / "out")["slow_len"]["n"] == len(log)
    # the client says what it read
    (tmp_path / "job.json").write_text(json.dumps({"dataset": {"uri": str(folder), "format": "otlp"},
                                                   "metrics": [{"id": "slow_len"}]}))
    proc = evalq("validate", str(tmp_path / "job.json"))
    assert proc.returncode == 0, proc.stderr
    assert "OTLP traces: 2 file(s), 26 spans (6 not GenAI" in proc.stdout and "valid: 14 instances" in proc.stdout


def test_traces_in_s3_by_prefix_and_by_time_partitioned_glob(exported, tmp_path):
    """The Collector's awss3 layout (gzipped parts under day/hour prefixes) on a real S3 API (moto)."""
    import boto3

    from tests.integration.test_datasets import AWS, start_moto

    folder, made = exported
    for k, v in AWS.items():
        os.environ.setdefault(k, v)
    proc, url = start_moto()
    try:
        client = boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                              **{k.lower(): v for k, v in AWS.items() if k != "AWS_DEFAULT_REGION"})
        client.create_bucket(Bucket="otel")
        for day, part in (("2026/11/25/23", "part-0.jsonl"), ("2026/11/26/00", "part-1.jsonl")):
            client.put_object(Bucket="otel", Key=f"traces/{day}/{part}.gz", Body=gzip.compress((folder / part).read_bytes()))
        client.put_object(Bucket="otel", Key="traces/2026/11/24/00/old.jsonl.gz", Body=b"not even gzip")

        def read(uri):
            return parse_job({"dataset": {"uri": uri, "format": "otlp", "endpoint_url": url},
                              "metrics": [{"id": "slow_len"}]})

        assert len(read("s3://otel/traces/2026/11/25/").instances) == 10  # a prefix
        assert len(read("s3://otel/traces/{2026/11/25,2026/11/26}/**").instances) == 14  # two days' partitions
        assert len(read("s3://otel/traces/2026/11/26/00/part-1.jsonl.gz").instances) == 4  # one object
        with pytest.raises(JobError, match="s3://otel/traces/2026/11/24/00/old.jsonl.gz line 1"):
            read("s3://otel/traces/2026/11/2[45]/**")
        with pytest.raises(JobError, match="no objects match"):
            read("s3://otel/traces/2027/**")
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_conversation_is_judged_turn_by_turn_and_a_run_by_its_calls(exported):
    """What the per-turn and agent metrics see of the instances traces make (judge calls recorded,
    not sent: tests/agents has them on judge-sim)."""
    from evalq.shared.agents.params import TurnsParams
    from evalq.workers.agents.judged import intent_resolution, tool_call_accuracy
    from tests.agents.test_agent_judges import Recorder

    folder, made = exported
    by_id = {inst["id"]: inst for inst in load(folder).instances}
    judge = Recorder()
    out = intent_resolution(by_id[made["conv"][-1][1]], TurnsParams(judge="j", turns="all"), judge)
    assert [t["turn"] for t in out["turns"]] == [1, 2, 3]
    for k, prompt in enumerate(judge.prompts):  # each turn on the conversation up to it
        assert f"answer {k}" in prompt and f"turn {k + 1}" not in prompt
    judge = Recorder()
    out = tool_call_accuracy(by_id[made["run"][1]], TurnsParams(judge="j"), judge)
    assert [c["name"] for c in out["calls"]] == ["weather", "calendar"]


def test_alternatives_stay_inside_the_request_roots_and_files_share_one_size_bound(exported, monkeypatch):
    """A request's {a,b} may not climb out of its roots; many files are held to one dataset's bound."""
    folder, _ = exported
    raw = {"dataset": {"uri": f"{folder}/{{part-0.jsonl,../../../etc/passwd}}", "format": "otlp"},
           "metrics": [{"id": "slow_len"}]}
    with pytest.raises(JobError, match=r"\.\./\.\./\.\./etc/passwd is outside the directories"):
        parse_job(raw, roots=[folder])
    assert len(parse_job({**raw, "dataset": {**raw["dataset"], "uri": f"{folder}/{{part-0,part-1}}.jsonl"}},
                         roots=[folder]).instances) == 14
    biggest = max(p.stat().st_size for p in folder.iterdir())
    monkeypatch.setenv("EVALQ_MAX_DATASET_BYTES", str(biggest + 10))  # each file fits; both do not
    with pytest.raises(JobError, match="larger than .* together"):
        load(folder)


def test_a_trace_or_conversation_over_the_span_bound_is_a_located_problem(exported, monkeypatch):
    """One agent run or conversation is held in memory while it is made: EVALQ_MAX_TRACE_SPANS
    bounds its spans; one over it is said (its trace or conversation id, its count), not read."""
    folder, made = exported
    run_trace = made["run"][0]
    monkeypatch.setenv("EVALQ_MAX_TRACE_SPANS", "4")  # the run has 5 GenAI spans, the conversation 3
    with pytest.raises(JobError) as err:
        load(folder)
    said = "\n".join(err.value.problems)
    assert f"trace {run_trace}: 5 GenAI spans, more than EVALQ_MAX_TRACE_SPANS (4)" in said
    assert "conversation conv-1" not in said
    monkeypatch.setenv("EVALQ_MAX_TRACE_SPANS", "2")
    job = parse_job({"dataset": {"uri": str(folder), "format": "otlp", "on_bad_record": "skip"},
                     "metrics": [{"id": "slow_len", "parameters": {"seconds": 0}}]})
    ids = {inst["id"] for inst in job.instances}
    assert made["run"][1] not in ids and made["conv"][-1][1] not in ids
    assert {c[0][1] for c in made["chat"]} <= ids  # the other instances are all there
    assert job.bad_records.count == 2
    listed = {b["where"]: " ".join(b["errors"]) for b in job.bad_records.shown}
    assert listed[f"trace {run_trace}"].startswith("5 GenAI spans, more than EVALQ_MAX_TRACE_SPANS (2)")
    assert listed["conversation conv-1"].startswith("3 GenAI spans")
    monkeypatch.setenv("EVALQ_MAX_TRACE_SPANS", "0")  # no limit
    assert made["run"][1] in {inst["id"] for inst in load(folder).instances}


def test_each_s3_alternative_is_held_to_the_tenants_places():
    """A {a,b} in an S3 uri names places of their own: the uri as written may fit a tenant's place
    (a wildcard bucket takes the brace) while one alternative lies outside it; each is checked, and
    nothing is listed or read."""
    from evalq.shared.policy.egress import S3Policy

    places = S3Policy(None, ["eval-*/nightly/A/"])  # a tenant's part of the operator's prefixes
    raw = {"dataset": {"uri": "s3://eval-{a/nightly/A/x,b/secret}/nightly/A/", "format": "otlp"},
           "metrics": [{"id": "slow_len"}]}
    with pytest.raises(JobError, match=r"s3://eval-b/secret/nightly/A/ is not a place this cluster may read"):
        parse_job(raw, s3=places)
