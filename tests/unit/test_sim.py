"""judge-sim over real loopback HTTP with the real ``openai`` SDK (no network)."""

from __future__ import annotations

import io
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal

import openai
import pytest
from click.testing import CliRunner
from pydantic import BaseModel, Field

from evalq.sim import Faults, JudgeSim, Region, judge_sim_command, main

ROOT = Path(__file__).resolve().parents[2]
PLAIN = re.compile(r"\AReason: (?P<reason>[^\n\d]+)\nScore: (?P<score>-?\d+)\Z")
API_VERSION = "2024-10-21"


def tokens(text: str) -> int:
    """The documented rule, computed independently of the server."""
    return math.ceil(len(text.encode("utf-8")) / 4)


def prompt_tokens(messages: list[dict]) -> int:
    return sum(4 + tokens(m["content"]) for m in messages)


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


# what "at once" may take on a loaded machine: the failures these bounds catch (a client or a stop
# waiting out judge-sim's timeout fault of 30 s or more) take that long or for ever
AT_ONCE = 15


def oai(sim: JudgeSim, region: str, **kw) -> openai.OpenAI:
    kw.setdefault("api_key", "x")
    kw.setdefault("max_retries", 0)
    return openai.OpenAI(base_url=sim.base_url(region), **kw)


def azure(sim: JudgeSim, region: str, **kw) -> openai.AzureOpenAI:
    kw.setdefault("api_key", "x")
    kw.setdefault("max_retries", 0)
    return openai.AzureOpenAI(azure_endpoint=sim.azure_endpoint(region), api_version=API_VERSION, **kw)


def raw(url: str, body: object | None = None, headers: dict | None = None,
        method: str | None = None) -> tuple[int, dict, dict]:
    """(status, headers, json body) without the SDK."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method or ("POST" if data is not None else "GET"),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read())


def chat_raw(sim: JudgeSim, region: str, text: str, key: str | None = "x", **extra) -> tuple[int, dict, dict]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return raw(sim.base_url(region) + "/chat/completions",
               {"model": "m", "messages": user(text), **extra}, headers)


@pytest.fixture(scope="module")
def sim():
    with JudgeSim([Region("lab", tpm=10_000_000, rpm=100_000)], models=["judge-a", "judge-b"],
                  fault_rates=Faults(timeout_seconds=60.0)) as s:  # far past AT_ONCE: a client that
        # waited the fault out is told from one that gave up (stop() wakes what still sleeps)
        yield s


@pytest.fixture
def client(sim):
    return oai(sim, "lab")


# ---------------------------------------------------------------- replies

def test_plain_reply_parses_and_usage_follows_the_token_rule(client):
    messages = [{"role": "system", "content": "You grade answers."},
                {"role": "user", "content": "Question: 2+2? Answer: 4 — ünïcode"}]
    r = client.chat.completions.create(model="judge-a", messages=messages)
    choice = r.choices[0]
    m = PLAIN.match(choice.message.content)
    assert m, choice.message.content
    assert 1 <= int(m["score"]) <= 5
    assert choice.finish_reason == "stop" and r.model == "judge-a"
    assert r.usage.prompt_tokens == prompt_tokens(messages) == 4 + 5 + 4 + 10
    assert r.usage.completion_tokens == tokens(choice.message.content)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_azure_deployment_path_replies_like_openai_for_the_same_model(sim, client):
    messages = user("Is Paris the capital of France?")
    via_azure = azure(sim, "lab").chat.completions.create(model="judge-a", messages=messages)
    via_openai = client.chat.completions.create(model="judge-a", messages=messages)
    assert PLAIN.match(via_azure.choices[0].message.content)
    assert via_azure.choices[0].message.content == via_openai.choices[0].message.content
    assert via_azure.usage.prompt_tokens == prompt_tokens(messages)


def test_reply_is_deterministic_and_depends_on_the_request(client):
    def ask(text: str, model: str = "judge-a") -> str:
        return client.chat.completions.create(model=model, messages=user(text)).choices[0].message.content

    assert ask("same question") == ask("same question")
    scores = {int(PLAIN.match(ask(f"question {i}"))["score"]) for i in range(15)}
    assert scores <= {1, 2, 3, 4, 5} and len(scores) >= 3
    models = {ask("same question", model=f"judge-{i}") for i in range(8)}
    assert len(models) > 1  # the model is part of the hash


def test_score_marker_in_last_user_message_sets_the_score(client):
    for want in (1, 3, 5, 9):
        r = client.chat.completions.create(model="judge-a", messages=user(f"grade this [[sim:score={want}]]"))
        assert PLAIN.match(r.choices[0].message.content)["score"] == str(want)
    # only the last user message counts; 0 is never a hashed score
    messages = [{"role": "system", "content": "[[sim:score=0]]"}, {"role": "user", "content": "grade"}]
    r = client.chat.completions.create(model="judge-a", messages=messages)
    assert PLAIN.match(r.choices[0].message.content)["score"] in {"1", "2", "3", "4", "5"}
    messages = [{"role": "user", "content": "[[sim:score=0]]"}, {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "again"}]
    r = client.chat.completions.create(model="judge-a", messages=messages)
    assert PLAIN.match(r.choices[0].message.content)["score"] != "0"


class Detail(BaseModel):
    note: str
    weight: int = Field(ge=10, le=20)


class Verdict(BaseModel):
    score: int = Field(ge=1, le=3)
    reason: str
    passed: bool
    label: Literal["good", "bad", "ugly"]
    confidence: float = Field(ge=0, le=1)
    detail: Detail
    tags: list[str]
    extra: int | None


def test_json_schema_reply_parses_into_the_pydantic_model(client):
    r = client.chat.completions.parse(model="judge-a", messages=user("grade [[sim:score=2]]"),
                                      response_format=Verdict)
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Verdict)
    assert parsed.score == 2 and parsed.reason and parsed.passed is False
    assert Verdict.model_validate_json(r.choices[0].message.content) == parsed
    # the score is clamped into the property's bounds
    r = client.chat.completions.parse(model="judge-a", messages=user("grade [[sim:score=5]]"),
                                      response_format=Verdict)
    assert r.choices[0].message.parsed.score == 3 and r.choices[0].message.parsed.passed is True


SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {"crit": {"type": "object", "required": ["name", "ok"], "additionalProperties": False,
                       "properties": {"name": {"type": "string", "minLength": 3, "maxLength": 5},
                                      "ok": {"type": "boolean"}}}},
    "required": ["score", "reason", "level", "ratio", "items", "when", "kind", "maybe", "id", "n"],
    "additionalProperties": False,
    "properties": {
        "score": {"type": "integer", "enum": [0, 10, 20]},
        "reason": {"type": "string", "maxLength": 12},
        "level": {"type": "integer", "exclusiveMinimum": 100, "exclusiveMaximum": 103},
        "ratio": {"type": "number", "exclusiveMinimum": 0.5, "maximum": 0.6},
        "items": {"type": "array", "minItems": 2, "items": {"$ref": "#/$defs/crit"}},
        "when": {"type": "string", "format": "date-time"},
        "kind": {"const": "judge"},
        "maybe": {"anyOf": [{"type": "null"}, {"type": "integer", "minimum": 7, "maximum": 7}]},
        "id": {"type": ["string", "null"], "format": "uuid"},
        "n": {"type": "number", "multipleOf": 1, "minimum": -3, "maximum": -2},
    },
}


def test_json_schema_reply_is_valid_for_a_hand_written_schema(client):
    jsonschema = pytest.importorskip("jsonschema")
    for i in range(5):
        r = client.chat.completions.create(
            model="judge-b", messages=user(f"case {i}"),
            response_format={"type": "json_schema",
                             "json_schema": {"name": "verdict", "schema": SCHEMA, "strict": True}})
        value = json.loads(r.choices[0].message.content)
        jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.FormatChecker()).validate(value)
        assert len(value["items"]) == 2 and value["maybe"] == 7 and value["kind"] == "judge"


def test_schema_value_is_public_deterministic_and_valid():
    """What the capacity planner answers its stand-in judge with (no server)."""
    jsonschema = pytest.importorskip("jsonschema")
    from evalq.sim import schema_value

    value = schema_value(SCHEMA, score=4, seed=b"x")
    jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.FormatChecker()).validate(value)
    assert value == schema_value(SCHEMA, score=4, seed=b"x")
    listing = {"type": "object", "properties": {"claims": {"type": "array", "items": {"type": "string"}}},
               "required": ["claims"]}
    assert schema_value(listing, fields={"claims": "a;b;c"}) == {"claims": ["a", "b", "c"]}
    with pytest.raises(ValueError):
        schema_value({"$ref": "#/$defs/missing"})


def test_json_object_reply_and_its_json_word_rule(client):
    r = client.chat.completions.create(model="judge-a", messages=user("Reply in JSON. [[sim:score=4]]"),
                                       response_format={"type": "json_object"})
    value = json.loads(r.choices[0].message.content)
    assert value["score"] == 4 and isinstance(value["reason"], str) and value["reason"]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="judge-a", messages=user("no magic word"),
                                       response_format={"type": "json_object"})


class Grade(BaseModel):
    score: int = Field(ge=1, le=5)
    reason: str


class Flag(BaseModel):
    flagged: bool
    category: Literal["spam", "abuse", "none"]


def test_tool_calls_carry_arguments_valid_for_the_chosen_function(client):
    tools = [openai.pydantic_function_tool(Grade), openai.pydantic_function_tool(Flag)]
    r = client.chat.completions.parse(model="judge-a", messages=user("judge [[sim:score=5]]"), tools=tools,
                                      tool_choice={"type": "function", "function": {"name": "Flag"}})
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls" and call.type == "function"
    assert call.function.name == "Flag" and isinstance(call.function.parsed_arguments, Flag)
    Flag.model_validate_json(call.function.arguments)

    r = client.chat.completions.parse(model="judge-a", messages=user("judge [[sim:score=5]]"), tools=tools)
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "Grade" and call.function.parsed_arguments.score == 5

    r = client.chat.completions.create(model="judge-a", messages=user("judge"), tools=tools, tool_choice="none")
    assert r.choices[0].message.tool_calls is None and PLAIN.match(r.choices[0].message.content)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="judge-a", messages=user("judge"), tools=tools,
                                       tool_choice={"type": "function", "function": {"name": "Nope"}})


def test_max_tokens_truncates_and_n_repeats_choices(client):
    r = client.chat.completions.create(model="judge-a", messages=user("long"), max_tokens=3)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3
    assert len(r.choices[0].message.content.encode()) <= 12 and "Score" not in r.choices[0].message.content
    one = client.chat.completions.create(model="judge-a", messages=user("twice"))
    two = client.chat.completions.create(model="judge-a", messages=user("twice"), n=2)
    assert [c.index for c in two.choices] == [0, 1]
    assert {c.message.content for c in two.choices} == {one.choices[0].message.content}
    assert two.usage.completion_tokens == 2 * one.usage.completion_tokens


def test_models_endpoint_lists_configured_models_and_any_model_is_accepted(client):
    assert [m.id for m in client.models.list()] == ["judge-a", "judge-b"]
    assert client.chat.completions.create(model="anything-else", messages=user("hi")).model == "anything-else"


def test_bad_requests_get_openai_style_errors(sim):
    port = sim.port("lab")
    status, _, body = raw(f"http://127.0.0.1:{port}/openai/deployments/d/chat/completions",
                          {"messages": user("hi")}, {"api-key": "x"})
    assert status == 400 and "api-version" in body["error"]["message"]
    status, _, body = raw(f"http://127.0.0.1:{port}/v2/nothing", {}, {"api-key": "x"})
    assert status == 404 and body["error"]["code"] == "not_found"
    status, _, body = chat_raw(sim, "lab", "hi", stream=True)
    assert status == 400 and body["error"]["param"] == "stream"
    status, _, body = raw(sim.base_url("lab") + "/chat/completions", {"model": "m", "messages": []},
                          {"api-key": "x"})
    assert status == 400 and body["error"]["type"] == "invalid_request_error"


# ---------------------------------------------------------------- rate limits

class Clock:
    """A clock the test moves by hand: the rate-limit windows slide when the test says, not when a
    loaded machine gets round to the next request."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_rpm_limit_returns_429_with_retry_after_and_the_window_slides():
    clock = Clock()
    with JudgeSim([Region("r", tpm=0, rpm=2)], window_seconds=2.0, clock=clock) as sim:
        c = oai(sim, "r")

        def ask():
            return c.chat.completions.create(model="m", messages=user("hi"))

        ask()
        clock.t += 0.5
        ask()
        with pytest.raises(openai.RateLimitError) as err:
            ask()
        headers = err.value.response.headers
        assert headers["retry-after-ms"] == "1500"  # until the first request leaves the 2 s window
        assert headers["retry-after"] == "2"
        assert err.value.body["code"] == "rate_limit_exceeded" and err.value.body["type"] == "requests"
        clock.t += 1.5
        ask()  # the first one slid out
        with pytest.raises(openai.RateLimitError) as err:
            ask()  # the second one is still inside: a sliding, not a fixed, window
        assert err.value.response.headers["retry-after-ms"] == "500"
        stats = sim.stats("r")
        assert (stats["ok"], stats["rate_limited"], stats["requests"]) == (3, 2, 5)
        assert stats["peak_window_requests"] == 2


def test_tpm_limit_counts_prompt_plus_max_tokens_at_admission():
    clock = Clock()
    with JudgeSim([Region("t", tpm=600, rpm=0), Region("d", tpm=300, rpm=0)], window_seconds=1.5,
                  clock=clock) as sim:
        c = oai(sim, "t")
        p = prompt_tokens(user("hi"))
        assert p == 5
        for _ in range(2):
            raw_resp = c.chat.completions.with_raw_response.create(model="m", messages=user("hi"), max_tokens=200)
        assert raw_resp.headers["x-ratelimit-remaining-tokens"] == str(600 - 2 * (p + 200))
        c.chat.completions.create(model="m", messages=user("hi"), max_completion_tokens=150)  # 565
        with pytest.raises(openai.RateLimitError) as err:
            c.chat.completions.create(model="m", messages=user("hi"), max_completion_tokens=100)
        assert err.value.body["type"] == "tokens" and int(err.value.response.headers["retry-after"]) >= 1
        with pytest.raises(openai.RateLimitError) as err:  # can never fit
            c.chat.completions.create(model="m", messages=user("hi"), max_tokens=1000)
        assert err.value.response.headers["x-should-retry"] == "false"
        assert sim.stats("t")["admitted_tokens"] == 2 * (p + 200) + (p + 150)

        d = oai(sim, "d")
        d.chat.completions.create(model="m", messages=user("hi"))  # default max_tokens: 256
        with pytest.raises(openai.RateLimitError) as err:
            d.chat.completions.create(model="m", messages=user("hi"))
        assert sim.stats("d")["admitted_tokens"] == p + 256
        assert err.value.response.headers["retry-after-ms"] == "1500"
        clock.t += 1.5
        d.chat.completions.create(model="m", messages=user("hi"))  # admitted again
        assert sim.stats("d")["ok"] == 2 and sim.stats("d")["rate_limited"] == 1


def test_concurrent_requests_are_admitted_exactly_up_to_the_limit():
    with JudgeSim([Region("c", tpm=0, rpm=10)], latency=0.05) as sim:
        c = oai(sim, "c")
        barrier = threading.Barrier(25)

        def one(i: int) -> str:
            barrier.wait(5)  # arrive together
            try:
                c.chat.completions.create(model="m", messages=user(f"q{i}"))
                return "ok"
            except openai.RateLimitError:
                return "429"

        with ThreadPoolExecutor(25) as pool:
            outcomes = list(pool.map(one, range(25)))
        assert outcomes.count("ok") == 10 and outcomes.count("429") == 15
        stats = sim.stats("c")
        assert (stats["requests"], stats["ok"], stats["rate_limited"], stats["admitted_requests"]) == (25, 10, 15, 10)
        assert stats["peak_window_requests"] == 10 and stats["peak_in_flight"] > 1 and stats["in_flight"] == 0


def test_regions_are_independent_ports():
    with JudgeSim([Region("a", rpm=1), Region("b", rpm=1)]) as sim:
        assert sim.port("a") != sim.port("b")
        oai(sim, "a").chat.completions.create(model="m", messages=user("hi"))
        with pytest.raises(openai.RateLimitError):
            oai(sim, "a").chat.completions.create(model="m", messages=user("hi"))
        oai(sim, "b").chat.completions.create(model="m", messages=user("hi"))
        assert raw(f"http://127.0.0.1:{sim.port('b')}/stats")[2]["region"] == "b"


# ---------------------------------------------------------------- faults

def test_fault_markers_produce_the_documented_faults(sim, client):
    with pytest.raises(openai.InternalServerError) as err:
        client.chat.completions.create(model="m", messages=user("x [[sim:500]]"))
    assert err.value.status_code == 500 and err.value.body["type"] == "server_error"

    with pytest.raises(openai.RateLimitError) as err:
        client.chat.completions.create(model="m", messages=user("x [[sim:429]]"))
    assert err.value.response.headers["retry-after"] == "1"

    r = client.chat.completions.create(model="m", messages=user("x [[sim:malformed]]"))
    content = r.choices[0].message.content
    assert "Score" not in content and not re.search(r"\d", content)

    r = client.chat.completions.create(model="m", messages=user("json [[sim:malformed]]"),
                                       response_format={"type": "json_object"})
    with pytest.raises(json.JSONDecodeError):
        json.loads(r.choices[0].message.content)

    r = client.chat.completions.create(model="m", messages=user("x [[sim:malformed]]"),
                                       tools=[openai.pydantic_function_tool(Grade)])
    with pytest.raises(json.JSONDecodeError):
        json.loads(r.choices[0].message.tool_calls[0].function.arguments)

    start = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        oai(sim, "lab", timeout=0.3).chat.completions.create(model="m", messages=user("x [[sim:timeout]]"))
    assert time.monotonic() - start < AT_ONCE


def test_500_once_fails_only_the_first_time_a_request_is_seen(sim, client):
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="m", messages=user("A [[sim:500-once]]"))
    assert PLAIN.match(client.chat.completions.create(
        model="m", messages=user("A [[sim:500-once]]")).choices[0].message.content)
    with pytest.raises(openai.InternalServerError):  # another request: its own first time
        client.chat.completions.create(model="m", messages=user("B [[sim:500-once]]"))
    before = sim.stats("lab")["errors"]["error500"]
    retrying = oai(sim, "lab", max_retries=1)  # the SDK's own retry gets through
    assert retrying.chat.completions.create(model="m", messages=user("C [[sim:500-once]]")).choices
    assert sim.stats("lab")["errors"]["error500"] == before + 1


def test_latency_and_delay_marker():
    with JudgeSim([Region("l")], latency=0.15) as sim:
        c = oai(sim, "l")
        start = time.monotonic()
        c.chat.completions.create(model="m", messages=user("hi"))
        assert time.monotonic() - start >= 0.15
        start = time.monotonic()
        c.chat.completions.create(model="m", messages=user("hi [[sim:delay=0.2]]"))
        assert time.monotonic() - start >= 0.35


def _outcomes(seed: int) -> list[str]:
    with JudgeSim([Region("f")], seed=seed, fault_rates=Faults(error500=0.3, malformed=0.3)) as sim:
        out = []
        for i in range(40):
            status, _, body = chat_raw(sim, "f", f"q{i}")
            out.append(str(status) if status != 200 else
                       ("ok" if PLAIN.match(body["choices"][0]["message"]["content"]) else "malformed"))
        stats = sim.stats("f")
        assert stats["errors"]["error500"] == out.count("500")
        assert stats["errors"]["malformed"] == out.count("malformed") and stats["ok"] == out.count("ok")
        return out


def test_random_faults_are_seeded_and_reproducible():
    first, again, other = _outcomes(3), _outcomes(3), _outcomes(4)
    assert first == again and first != other
    assert {"ok", "500", "malformed"} <= set(first) and set(first) <= {"ok", "500", "malformed"}


def test_timeout_fault_can_answer_late():
    faults = Faults(timeout=1.0, timeout_seconds=0.3, timeout_action="late")
    with JudgeSim([Region("s")], fault_rates=faults) as sim:
        start = time.monotonic()
        r = oai(sim, "s", timeout=5).chat.completions.create(model="m", messages=user("hi"))
        assert time.monotonic() - start >= 0.3 and PLAIN.match(r.choices[0].message.content)
        stats = sim.stats("s")
        assert stats["errors"]["timeout"] == 1 and stats["ok"] == 0


# ---------------------------------------------------------------- stats, auth, lifecycle

def test_stats_count_requests_outcomes_and_tokens():
    with JudgeSim([Region("s", tpm=100_000, rpm=1000)]) as sim:
        c = oai(sim, "s")
        usages = []
        for text in ("one", "two two"):
            usages.append(c.chat.completions.create(model="m", messages=user(text), max_tokens=100).usage)
        with pytest.raises(openai.InternalServerError):
            c.chat.completions.create(model="m", messages=user("[[sim:500]]"), max_tokens=100)
        usages.append(c.chat.completions.create(model="m", messages=user("[[sim:malformed]]"),
                                                max_tokens=100).usage)
        with pytest.raises(openai.RateLimitError):
            c.chat.completions.create(model="m", messages=user("[[sim:429]]"), max_tokens=100)
        assert chat_raw(sim, "s", "no key", key=None)[0] == 401
        assert chat_raw(sim, "s", "x", response_format={"type": "json_object"})[0] == 400

        url = f"http://127.0.0.1:{sim.port('s')}/stats"
        over_http = raw(url)[2]
        assert over_http == sim.stats("s") == sim.stats()["s"]
        assert over_http["requests"] == 7 and over_http["ok"] == 2
        assert over_http["rate_limited"] == 1 and over_http["rate_limited_injected"] == 1
        assert over_http["errors"] == {"error500": 1, "timeout": 0, "malformed": 1, "total": 2}
        assert over_http["unauthorized"] == 1 and over_http["bad_request"] == 1
        assert over_http["prompt_tokens"] == sum(u.prompt_tokens for u in usages)
        assert over_http["completion_tokens"] == sum(u.completion_tokens for u in usages)
        admitted = [prompt_tokens(user(t)) + 100 for t in ("one", "two two", "[[sim:500]]", "[[sim:malformed]]")]
        assert over_http["admitted_requests"] == 4 and over_http["admitted_tokens"] == sum(admitted)
        assert over_http["window_tokens"] == over_http["peak_window_tokens"] == sum(admitted)

        after = raw(url + "/reset", {}, method="POST")[2]
        assert after["requests"] == after["ok"] == after["admitted_tokens"] == after["prompt_tokens"] == 0
        assert after["window_requests"] == 4  # the rate-limit window is kept...
        assert raw(url + "/reset?limits=1", {}, method="POST")[2]["window_requests"] == 0  # ...unless asked


def test_api_key_is_enforced_when_set_and_never_logged():
    log = io.StringIO()
    with JudgeSim([Region("k")], api_key="s3cret-key", log=log) as sim:
        with pytest.raises(openai.AuthenticationError):
            oai(sim, "k", api_key="wrong-key-123").chat.completions.create(model="m", messages=user("hi"))
        assert oai(sim, "k", api_key="s3cret-key").chat.completions.create(model="m", messages=user("hi")).choices
        assert azure(sim, "k", api_key="s3cret-key").chat.completions.create(model="d", messages=user("hi")).choices
        with pytest.raises(openai.AuthenticationError):
            azure(sim, "k", api_key="wrong-key-123").chat.completions.create(model="d", messages=user("hi"))
        with pytest.raises(openai.AuthenticationError):
            oai(sim, "k", api_key="wrong-key-123").models.list()
        assert chat_raw(sim, "k", "hi", key=None)[0] == 401
        assert sim.stats("k")["unauthorized"] == 3 and sim.stats("k")["ok"] == 2
    text = log.getvalue()
    assert text.count("\n") >= 6 and " 401" in text and " 200" in text
    assert "s3cret" not in text and "wrong-key" not in text and "s3cret" not in repr(sim)


def _refuses(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_stop_is_prompt_even_with_a_hanging_request():
    sim = JudgeSim([Region("h")], fault_rates=Faults(timeout_seconds=30)).start()
    port = sim.port("h")
    errors: list[Exception] = []

    def hang():
        try:
            oai(sim, "h", timeout=20).chat.completions.create(model="m", messages=user("[[sim:timeout]]"))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    t = threading.Thread(target=hang)
    t.start()
    deadline = time.monotonic() + 5
    while sim.stats("h")["in_flight"] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sim.stats("h")["in_flight"] == 1
    start = time.monotonic()
    sim.stop()
    assert time.monotonic() - start < AT_ONCE
    t.join(5)
    assert not t.is_alive() and isinstance(errors[0], openai.APIConnectionError)
    assert _refuses(port)


def test_cli_prints_one_line_per_region_and_stops_on_sigterm():
    proc = subprocess.Popen(
        [sys.executable, "-m", "evalq.sim", "--region", "lab:1000:5", "--region", "eu:0:0",
         "--window", "5", "--latency", "0.01"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        lines = [proc.stdout.readline().strip() for _ in range(2)]
        urls = {}
        for line in lines:
            name, url = line.split(" ")
            assert re.fullmatch(r"http://127\.0\.0\.1:\d+/v1", url)
            urls[name] = url
        assert set(urls) == {"lab", "eu"}
        lab = raw(urls["lab"].removesuffix("/v1") + "/stats")[2]
        assert (lab["tpm"], lab["rpm"], lab["window_seconds"]) == (1000, 5, 5.0)
        eu = raw(urls["eu"].removesuffix("/v1") + "/stats")[2]
        assert (eu["tpm"], eu["rpm"]) == (None, None)
        r = openai.OpenAI(base_url=urls["eu"], api_key="x", max_retries=0).chat.completions.create(
            model="m", messages=user("hi"))
        assert PLAIN.match(r.choices[0].message.content)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_rejects_bad_region_specs():
    result = CliRunner().invoke(judge_sim_command, ["--region", "lab:lots:5"])
    assert result.exit_code == 2 and "NAME:TPM:RPM" in result.output
    assert main(["--region", "a:1:1", "--region", "a:2:2"]) == 2  # duplicate names


FIELDS = {"type": "object", "required": ["severity", "violence", "claims", "entails", "other", "relation"],
          "properties": {"severity": {"type": "integer", "minimum": 0, "maximum": 7},
                         "violence": {"type": "object", "required": ["severity"],
                                      "properties": {"severity": {"type": "integer", "minimum": 0, "maximum": 7}}},
                         "claims": {"type": "array", "items": {"type": "string"}},
                         "entails": {"type": "boolean"}, "other": {"type": "boolean"},
                         "relation": {"type": "string", "enum": ["equivalent", "contradiction"]}}}


def _fields(client, text: str) -> dict:
    r = client.chat.completions.create(
        model="judge-a", messages=user(text),
        response_format={"type": "json_schema", "json_schema": {"name": "f", "schema": FIELDS}})
    return json.loads(r.choices[0].message.content)


def test_field_markers_set_reply_properties_by_name_or_path(client):
    got = _fields(client, "CLAIM: sky blue [[sim:severity=3]] [[sim:violence.severity=6]] "
                          "[[sim:claims=sky_blue;grass_green]] [[sim:entails=sky_blue;x]] [[sim:bool=false]] "
                          "[[sim:relation=contradiction]]")
    assert got["severity"] == 3 and got["violence"] == {"severity": 6}  # the path wins over the name
    assert got["claims"] == ["sky blue", "grass green"]
    assert got["entails"] is True  # "sky blue" appears in the request outside the markers
    assert got["other"] is False  # [[sim:bool=false]] sets every other boolean
    assert got["relation"] == "contradiction"
    got = _fields(client, "CLAIM: water wet [[sim:entails=sky_blue]] [[sim:other=true]] [[sim:bool=false]]")
    assert got["entails"] is False and got["other"] is True
    # a value that does not suit the property is ignored: the reply stays valid
    got = _fields(client, "[[sim:severity=9]] [[sim:relation=maybe]]")
    assert 0 <= got["severity"] <= 7 and got["relation"] in ("equivalent", "contradiction")


def test_echo_marker_repeats_the_last_user_message_in_a_plain_reply(client):
    r = client.chat.completions.create(model="m", messages=user("Say it [[sim:echo]] [[sim:severity=5]]"))
    assert r.choices[0].message.content == "Say it [[sim:severity=5]]"


def test_per_request_counts_show_a_request_paid_twice():
    with JudgeSim([Region("a"), Region("b")], per_request=True) as sim:
        for region, text in (("a", "one"), ("a", "two"), ("b", "one")):
            oai(sim, region).chat.completions.create(model="judge-sim", messages=user(text))
        counts = sim.answered()
        assert sorted(counts.values()) == [1, 2] and sim.answered("a") == dict.fromkeys(sim.answered("a"), 1)
        sim.reset_stats()
        assert sim.answered() == {}
    with JudgeSim() as plain:  # off by default: a long-running sim keeps no per-request state
        oai(plain, "local").chat.completions.create(model="judge-sim", messages=user("one"))
        assert plain.answered() == {}


def test_held_calls_wait_unanswered_until_released():
    """hold(after=N): the next N admitted calls are answered, later ones wait (counted in `held`)
    until release(); over HTTP as in Python. A test holds a job open with it instead of racing it."""
    import threading

    with JudgeSim([Region("g")]) as sim:
        base = sim.azure_endpoint("g")
        status, _, stats = raw(base + "/hold?after=1", {})
        assert status == 200 and stats["held"] == 0
        assert chat_raw(sim, "g", "first")[0] == 200  # let through
        answers: list[int] = []
        waiting = [threading.Thread(target=lambda: answers.append(chat_raw(sim, "g", "later")[0])) for _ in range(2)]
        for t in waiting:
            t.start()
        deadline = time.monotonic() + AT_ONCE
        while sim.stats("g")["held"] < 2:
            assert time.monotonic() < deadline, "the calls were not held"
            time.sleep(0.01)
        assert answers == [] and sim.stats("g")["ok"] == 1
        assert raw(base + "/release", {})[0] == 200
        for t in waiting:
            t.join(AT_ONCE)
        assert answers == [200, 200] and sim.stats("g")["held"] == 0 and sim.stats("g")["ok"] == 3
        assert raw(base + "/hold?after=x", {})[0] == 400
        sim.hold("g")  # held, then the sim stops: the call is dropped, not left hanging
        dropped: list[Exception] = []

        def at_stop() -> None:
            try:
                chat_raw(sim, "g", "at stop")
            except Exception as exc:  # noqa: BLE001 - the connection is dropped
                dropped.append(exc)

        t = threading.Thread(target=at_stop)
        t.start()
        while sim.stats("g")["held"] < 1:
            time.sleep(0.01)
    t.join(AT_ONCE)
    assert not t.is_alive() and dropped


def _headers(sim: JudgeSim, region: str) -> dict:
    raw = oai(sim, region).chat.completions.with_raw_response.create(model="judge-a", messages=user("hello"),
                                                                         max_tokens=10)
    return {k.lower(): v for k, v in raw.headers.items() if k.lower().startswith("x-ratelimit")}


def test_rate_headers_come_in_openai_s_azure_s_or_no_form_and_limits_change_while_it_runs():
    with JudgeSim([Region("a", tpm=1000, rpm=10)], window_seconds=60, rate_headers="openai") as sim:
        said = _headers(sim, "a")
        assert said["x-ratelimit-limit-tokens"] == "1000" and said["x-ratelimit-limit-requests"] == "10"
        assert said["x-ratelimit-remaining-requests"] == "9"
        assert said["x-ratelimit-reset-requests"].endswith("s") and float(said["x-ratelimit-reset-requests"][:-1]) > 59
        sim.set_limits("a", tpm=500)
        assert _headers(sim, "a")["x-ratelimit-limit-tokens"] == "500"
        request = urllib.request.Request(f"http://127.0.0.1:{sim.port('a')}/limits?rpm=2", data=b"{}", method="POST")
        with urllib.request.urlopen(request) as reply:
            assert json.load(reply)["rpm"] == 2
        with pytest.raises(openai.RateLimitError):  # two calls in the window already: the new RPM holds
            _headers(sim, "a")
        sim.rate_headers = "azure"
        sim.set_limits("a", rpm=10)
        assert set(_headers(sim, "a")) == {"x-ratelimit-remaining-tokens", "x-ratelimit-remaining-requests"}
        sim.rate_headers = "none"
        assert _headers(sim, "a") == {}


def test_slots_serve_that_many_calls_at_once_and_queue_the_rest():
    with JudgeSim([Region("s")], latency=0.3, slots=2) as sim:
        client = oai(sim, "s")
        t0 = time.monotonic()
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda _: client.chat.completions.create(model="m", messages=user("x")), range(4)))
        elapsed = time.monotonic() - t0
        stats = sim.stats("s")
    assert stats["ok"] == 4 and stats["peak_in_flight"] == 4  # all four were in flight ...
    assert elapsed >= 0.6  # ... and served two at a time: two rounds of 0.3 s


def test_cli_takes_biases_and_slots():
    """Issue 74, item 5: biases and slots were Python-only (JudgeSim(biases=..., slots=...))."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "evalq.sim", "--region", "lab:0:0", "--latency", "0.2", "--slots", "1",
         "--bias", "judge-x:leniency=1", "--bias", "judge-y:noise=0,first=0.7"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        url = proc.stdout.readline().split(" ")[1].strip()
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0)

        def score(model: str) -> str:
            r = client.chat.completions.create(model=model, messages=user("grade this [[sim:score=3]]"))
            return PLAIN.match(r.choices[0].message.content)["score"]

        t0 = time.monotonic()
        with ThreadPoolExecutor(2) as pool:  # two at once through one slot: served one after the other
            got = list(pool.map(score, ["judge-x", "judge-y"]))
        elapsed = time.monotonic() - t0
        assert got == ["4", "3"]  # the lenient judge a point up, the other as the marker says
        stats = raw(url.removesuffix("/v1") + "/stats")[2]
        assert stats["peak_in_flight"] == 2 and stats["ok"] == 2 and elapsed >= 0.4, (stats, elapsed)
    finally:
        proc.terminate()
        proc.wait(timeout=5)
    for bad, said in ((["--bias", "leniency=one"], "leniency takes a number"),
                      (["--bias", "kindness=1"], "KEY one of first, longer, noise, leniency"),
                      (["--bias", "first=2"], "first must be in [0, 1]"),
                      (["--bias", "m:noise=0.1", "--bias", "noise=0.2"], "give every --bias a MODEL:"),
                      (["--slots", "0"], "--slots")):
        result = CliRunner().invoke(judge_sim_command, bad)
        assert result.exit_code == 2 and said in result.output, (bad, result.output)


def test_cli_tells_a_models_shutdown_date_as_openai_and_azure_list_it():
    """Issue 75: judge-sim can be told a model that retires; its model lists say it as each provider does."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "evalq.sim", "--region", "lab:0:0", "--model", "gpt-4.1", "--shutdown", "gpt-5=2026-12-11"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        url = proc.stdout.readline().split(" ")[1].strip()
        listed = openai.OpenAI(base_url=url, api_key="x", max_retries=0).models.list()
        said = {m.id: m.to_dict().get("shutdown_date") for m in listed}
        azure = openai.AzureOpenAI(azure_endpoint=url.removesuffix("/v1"), api_key="x", api_version="2024-10-21",
                                   max_retries=0).models.list()
        deprecated = {m.id: (m.to_dict().get("deprecation") or {}).get("inference") for m in azure}
    finally:
        proc.terminate()
        proc.wait(timeout=5)
    assert said == {"gpt-4.1": None, "gpt-5": "2026-12-11"} and deprecated == said
    for bad in (["--shutdown", "gpt-5"], ["--shutdown", "gpt-5=next week"], ["--shutdown", "=2026-12-11"]):
        result = CliRunner().invoke(judge_sim_command, bad)
        assert result.exit_code == 2 and "MODEL=YYYY-MM-DD" in result.output, (bad, result.output)
