"""The Batch API client's pure parts (evalq.workers.judge.batch_api): custom_ids, input
lines in OpenAI's and Azure's forms, the enqueued-token estimate, the polling back-off,
a batch's status and reading output and error lines. No network (the client against
judge-sim: tests/integration/test_batch_api.py)."""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from evalq.shared.judging.judge_reply import Reply
from evalq.shared.judging.judges import JudgeConfig
from evalq.shared.judging.tokens import PER_MESSAGE, PER_REPLY, count_text
from evalq.workers.judge.batch_api import (BatchClient, BatchStatus, CallRef, LineError, custom_id, estimate_tokens,
                                           index_calls, input_file, parse_custom_id, poll_delay, read_outcomes,
                                           request_line)

DIGEST = hashlib.sha256(b"a request").hexdigest()


def openai_judge(**batch) -> JudgeConfig:
    return JudgeConfig.model_validate({
        "provider": "openai", "model": "gpt-4o-mini", "api_key_env": "X_API_KEY", "max_tokens": 50,
        "deployments": [{"region": "r", "tpm": 100, "rpm": 10, "batch": {"enqueued_tokens": 9, **batch}}]})


def azure_judge(batch_deployment: str | None = None) -> JudgeConfig:
    batch = {"enqueued_tokens": 9, **({"deployment": batch_deployment} if batch_deployment else {})}
    return JudgeConfig.model_validate({
        "provider": "azure", "model": "gpt-4o", "api_key_env": "X_API_KEY", "api_version": "2024-10-21",
        "deployments": [{"region": "se", "endpoint": "https://se.openai.azure.com", "deployment": "gpt4o-std",
                         "tpm": 100, "rpm": 10, "batch": batch}]})


# --- custom_id -----------------------------------------------------------------------------------

@pytest.mark.parametrize("job, entry, item", [
    ("0123456789abcdef", "coherence@0", 0),
    ("a job id with spaces/slashes and ünïcode" * 5, "rubric_llm@12", 10**12 - 1),
    ("j", "generate", 7),
])
def test_a_custom_id_is_short_safe_and_reads_back(job, entry, item):
    cid = custom_id(job, entry, item, DIGEST)
    assert len(cid) <= 64 and re.fullmatch(r"[A-Za-z0-9_-]+", cid)  # OpenAI's and Anthropic's rules
    parsed = parse_custom_id(cid)
    assert (parsed.job_tag, parsed.entry_tag, parsed.item, parsed.call) == (
        hashlib.sha256(job.encode()).hexdigest()[:10], hashlib.sha256(entry.encode()).hexdigest()[:8], item,
        DIGEST[:16])
    ref = CallRef(job, entry, item, DIGEST)
    assert ref.custom_id == cid and parsed.matches(ref)
    assert not parsed.matches(CallRef(job, entry, item + 1, DIGEST))
    assert not parsed.matches(CallRef(job + "x", entry, item, DIGEST))


def test_each_part_of_a_call_changes_its_custom_id():
    other = hashlib.sha256(b"another request").hexdigest()
    ids = {custom_id("j1", "e@0", 1, DIGEST), custom_id("j2", "e@0", 1, DIGEST), custom_id("j1", "e@1", 1, DIGEST),
           custom_id("j1", "e@0", 2, DIGEST), custom_id("j1", "e@0", 1, other)}
    assert len(ids) == 5


@pytest.mark.parametrize("item, digest", [(-1, DIGEST), (10**12, DIGEST), (True, DIGEST), ("3", DIGEST),
                                          (1, "not-hex"), (1, DIGEST[:15]), (1, DIGEST.upper())])
def test_a_bad_item_or_digest_is_refused(item, digest):
    with pytest.raises(ValueError):
        custom_id("j", "e", item, digest)


@pytest.mark.parametrize("text", ["", "custom-1", "ev1-xyz", custom_id("j", "e", 1, DIGEST) + "0", None, 12])
def test_a_foreign_custom_id_does_not_parse(text):
    with pytest.raises(ValueError):
        parse_custom_id(text)


def test_index_refuses_the_same_call_twice():
    refs = [CallRef("j", "e@0", 1, DIGEST), CallRef("j", "e@0", 2, DIGEST)]
    assert set(index_calls(refs)) == {r.custom_id for r in refs}
    with pytest.raises(ValueError, match="send the call once"):
        index_calls(refs + [CallRef("j", "e@0", 1, DIGEST)])


# --- input lines ---------------------------------------------------------------------------------------

BODY = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Grade this."}], "temperature": 0.1,
        "max_tokens": 50}


def test_openai_lines_post_to_v1_chat_completions_with_the_judges_model():
    judge = openai_judge()
    line = request_line(judge, judge.deployments[0], "c1", {**BODY, "model": "whatever"})
    assert line == {"custom_id": "c1", "method": "POST", "url": "/v1/chat/completions",
                    "body": {**BODY, "model": "gpt-4o-mini"}}


@pytest.mark.parametrize("batch_deployment, model", [(None, "gpt4o-std"), ("gpt4o-global-batch", "gpt4o-global-batch")])
def test_azure_lines_name_the_batch_deployment(batch_deployment, model):
    judge = azure_judge(batch_deployment)
    line = request_line(judge, judge.deployments[0], "c1", BODY)
    assert (line["url"], line["body"]["model"]) == ("/chat/completions", model)
    assert {k: v for k, v in line["body"].items() if k != "model"} == {k: v for k, v in BODY.items() if k != "model"}


def test_an_input_file_is_json_lines_in_order_and_checked():
    judge = openai_judge()
    data = input_file(judge, judge.deployments[0], [("a", BODY), ("b", {**BODY, "max_tokens": 7})])
    assert data.endswith(b"\n")
    lines = [json.loads(x) for x in data.decode().splitlines()]
    assert [(x["custom_id"], x["body"]["max_tokens"]) for x in lines] == [("a", 50), ("b", 7)]
    for bad, message in [([], "at least one line"), ([("a", BODY), ("a", BODY)], "given twice"),
                         ([("x" * 65, BODY)], "1 to 64"), ([("", BODY)], "1 to 64")]:
        with pytest.raises(ValueError, match=message):
            input_file(judge, judge.deployments[0], bad)


def test_the_token_estimate_adds_prompt_estimates_and_completion_limits():
    schema = {"type": "json_schema", "json_schema": {"name": "rating", "schema": {"type": "object"}, "strict": True}}
    bodies = [BODY, {**BODY, "max_tokens": None, "max_completion_tokens": 20, "n": 2},
              {**BODY, "response_format": schema}, {k: v for k, v in BODY.items() if k != "max_tokens"}]

    def prompt(body: dict) -> int:  # as evalq.shared.judging.tokens documents it, schema text included
        extra = json.dumps({k: v for k, v in body.items() if k in ("response_format", "tools")})
        return PER_REPLY + sum(PER_MESSAGE + count_text(m["content"]) + count_text(m["role"])
                               for m in body["messages"]) + count_text(extra)
    expected = (prompt(bodies[0]) + 50) + (prompt(bodies[1]) + 40) + (prompt(bodies[2]) + 50) + (prompt(bodies[3]) + 33)
    assert estimate_tokens(bodies, default_max_tokens=33) == expected
    assert prompt(bodies[2]) > prompt(bodies[0])


def test_polls_back_off_from_five_seconds_to_five_minutes_with_jitter():
    assert [poll_delay(n, jitter=0) for n in range(9)] == [5, 10, 20, 40, 80, 160, 300, 300, 300]
    assert poll_delay(10**6, jitter=0) == 300
    assert poll_delay(0, rand=lambda: 0.0) == pytest.approx(4.0) and poll_delay(0, rand=lambda: 1.0) == pytest.approx(6.0)
    assert [poll_delay(n, first=0.1, cap=0.5, jitter=0) for n in range(4)] == [0.1, 0.2, 0.4, 0.5]
    spread = {round(poll_delay(3), 6) for _ in range(50)}
    assert len(spread) > 1 and all(32 <= d <= 48 for d in spread)


# --- status and outcomes -------------------------------------------------------------------------------

def test_expected_end_extrapolates_progress_and_falls_back_to_the_window():
    running = BatchStatus("b", "in_progress", total=100, completed=20, failed=5, created_at=1000,
                          in_progress_at=1010, expires_at=1000 + 86400)
    assert running.expected_end(now=1110) == pytest.approx(1010 + 100 * 100 / 25)
    assert BatchStatus("b", "validating", expires_at=5000).expected_end(now=10) == 5000
    slow = BatchStatus("b", "in_progress", total=100, completed=1, in_progress_at=0, expires_at=500)
    assert slow.expected_end(now=100) == 500  # never later than the window's end
    assert BatchStatus("b", "completed").expected_end(now=1) is None and BatchStatus("b", "completed").ended
    assert not running.ended


def completion(content=None, arguments=None) -> dict:
    message = {"role": "assistant", "content": content}
    if arguments is not None:
        message["tool_calls"] = [{"id": "call_1", "type": "function",
                                  "function": {"name": "rating", "arguments": arguments}}]
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}}


def test_output_and_error_lines_read_as_replies_and_errors():
    lines = [
        {"id": "r1", "custom_id": "ok", "response": {"status_code": 200, "body": completion('{"score": 4}')},
         "error": None},
        {"id": "r2", "custom_id": "tool", "response": {"status_code": 200, "body": completion(None, '{"score": 2}')},
         "error": None},
        {"id": "r3", "custom_id": "boom", "error": None, "response": {"status_code": 500, "body": {
            "error": {"code": "server_error", "message": "oops"}}}},
        {"id": "r4", "custom_id": "bad", "error": None, "response": {"status_code": 400, "body": {
            "error": {"message": "bad schema"}}}},
        {"id": "r5", "custom_id": "late", "response": None,
         "error": {"code": "batch_expired", "message": "not done in the window"}},
        {"id": "r6", "custom_id": "stop", "response": None, "error": {"code": "batch_cancelled", "message": "x"}},
        {"id": "r7", "custom_id": "odd", "response": {"status_code": 200, "body": {"choices": []}}, "error": None},
    ]
    data = ("\n".join(json.dumps(x) for x in lines) + "\nnot json\n").encode()
    out = read_outcomes(data)
    assert out["ok"] == Reply('{"score": 4}', None, {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17,
                                                      "completion_tokens_details": None, "prompt_tokens_details": None},
                             model="m")  # who the provider says answered: part of the judge's identity
    assert (out["tool"].content, out["tool"].tool_arguments, out["tool"].text()) == (None, '{"score": 2}', '{"score": 2}')
    assert out["boom"] == LineError("failed", "server_error", "oops", 500) and out["boom"].retryable
    assert out["bad"] == LineError("failed", "http_400", "bad schema", 400) and not out["bad"].retryable
    assert (out["late"].kind, out["late"].code, out["late"].retryable) == ("expired", "batch_expired", True)
    assert out["stop"].kind == "cancelled"
    assert (out["odd"].kind, out["odd"].code) == ("failed", "invalid_response")
    assert set(out) == {x["custom_id"] for x in lines}


def test_a_client_needs_a_deployment_that_declares_batch():
    judge = JudgeConfig.model_validate({"provider": "openai", "model": "m", "api_key_env": "X_API_KEY",
                                        "deployments": [{"region": "r", "tpm": 1, "rpm": 1}]})
    with pytest.raises(ValueError, match="declares no 'batch'"):
        BatchClient(judge, judge.deployments[0])
