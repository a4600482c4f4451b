"""judge-sim's Files and Batches APIs over real loopback HTTP with the real ``openai`` SDK
(OpenAI and Azure OpenAI clients): lifecycle, replies equal to the synchronous ones,
failed lines, expiry, cancel, the enqueued-token limit, keys and malformed input."""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest
from click.testing import CliRunner

from evalq.sim import JudgeSim, Region, judge_sim_command, parse_region

ROOT = Path(__file__).resolve().parents[2]
API_VERSION = "2024-10-21"
CHAT = "/v1/chat/completions"
TERMINAL = {"completed", "failed", "expired", "cancelled"}


# ---------------------------------------------------------------- helpers (computed independently of the sim)

def tokens(text: str) -> int:
    return math.ceil(len(text.encode("utf-8")) / 4)


def estimate(body: dict, default_max_tokens: int = 256) -> int:
    """The documented enqueued-token estimate: prompt tokens + max_tokens * n."""
    prompt = sum(4 + tokens(m["content"]) for m in body["messages"])
    return prompt + body.get("max_tokens", default_max_tokens) * body.get("n", 1)


def fails(seed: int, custom_id: str, attempt: int, fraction: float) -> bool:
    """The documented rule for batch_fail_fraction."""
    x = int(hashlib.sha256(f"{seed}:{custom_id}:{attempt}".encode()).hexdigest()[:16], 16)
    return x / 2 ** 64 < fraction


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def req(custom_id: str, body: dict, url: str = CHAT) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def jsonl(lines: list) -> bytes:
    return "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines).encode()


def oai(sim: JudgeSim, region: str, **kw) -> openai.OpenAI:
    kw.setdefault("api_key", "x")
    return openai.OpenAI(base_url=sim.base_url(region), max_retries=0, **kw)


def azure(sim: JudgeSim, region: str, **kw) -> openai.AzureOpenAI:
    kw.setdefault("api_key", "x")
    return openai.AzureOpenAI(azure_endpoint=sim.azure_endpoint(region), api_version=API_VERSION,
                              max_retries=0, **kw)


def submit(client: openai.OpenAI, lines: list, endpoint: str = CHAT, **kw):
    f = client.files.create(file=("requests.jsonl", jsonl(lines)), purpose="batch")
    return client.batches.create(input_file_id=f.id, endpoint=endpoint, completion_window="24h", **kw)


def wait(client: openai.OpenAI, batch_id: str, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in TERMINAL or time.monotonic() > deadline:
            return batch
        time.sleep(0.02)


def read_lines(client: openai.OpenAI, file_id: str | None) -> dict[str, dict]:
    if file_id is None:
        return {}
    text = client.files.content(file_id).text
    lines = [json.loads(x) for x in text.splitlines()]
    by_id = {x["custom_id"]: x for x in lines}
    assert len(by_id) == len(lines)  # each custom_id once
    return by_id


def post(url: str, body: dict, headers: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "api-key": "x",
                                              **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


class Clock:
    """A clock the test moves by hand: batches' lives without waiting."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


SCHEMA = {"type": "object", "properties": {"score": {"type": "integer", "minimum": 1, "maximum": 5},
                                           "reason": {"type": "string"}},
          "required": ["score", "reason"], "additionalProperties": False}
TOOL = {"type": "function", "function": {"name": "grade", "parameters": SCHEMA}}


def bodies(model: str) -> dict[str, dict]:
    """Request bodies of every reply kind, by custom_id."""
    return {
        "plain": {"model": model, "messages": [{"role": "system", "content": "You grade."},
                                               {"role": "user", "content": "Q: 2+2? A: 4 — ünï"}]},
        "score": {"model": model, "messages": user("Rate it [[sim:score=2]]"), "max_tokens": 50},
        "json": {"model": model, "messages": user("Answer in json."), "response_format": {"type": "json_object"}},
        "schema": {"model": model, "messages": user("Grade this."), "response_format": {
            "type": "json_schema", "json_schema": {"name": "g", "schema": SCHEMA, "strict": True}}},
        "tools": {"model": model, "messages": user("Use the tool."), "tools": [TOOL],
                  "tool_choice": {"type": "function", "function": {"name": "grade"}}},
        "n2": {"model": model, "messages": user("Twice."), "n": 2},
        "cut": {"model": model, "messages": user("Short."), "max_tokens": 3},
        "malformed": {"model": model, "messages": user("Broken [[sim:malformed]]")},
    }


def same_reply(batch_body: dict, sync_body: dict) -> None:
    for key in ("choices", "usage"):
        assert json.dumps(batch_body[key]) == json.dumps(sync_body[key]), key
    assert batch_body["model"] == sync_body["model"] and batch_body["object"] == "chat.completion"


# ---------------------------------------------------------------- lifecycle and replies

def test_openai_batch_runs_to_completed_and_answers_each_line_like_the_sync_endpoint():
    with JudgeSim([Region("lab", tpm=100, rpm=1, batch_delay=0.3)], per_request=True) as sim:
        client = oai(sim, "lab")
        cases = bodies("judge-a")
        batch = submit(client, [req(cid, body) for cid, body in cases.items()], metadata={"job": "j1"})
        assert batch.status == "validating" and batch.endpoint == CHAT and batch.metadata == {"job": "j1"}
        seen = set()
        while batch.status not in TERMINAL:
            time.sleep(0.02)
            batch = client.batches.retrieve(batch.id)
            seen.add(batch.status)
        assert batch.status == "completed" and "in_progress" in seen
        assert batch.request_counts.model_dump() == {"total": len(cases), "completed": len(cases), "failed": 0}
        assert batch.error_file_id is None and batch.errors is None and batch.model == "judge-a"
        assert batch.created_at <= batch.in_progress_at <= batch.finalizing_at <= batch.completed_at
        assert batch.expires_at == batch.created_at + 86400
        out = read_lines(client, batch.output_file_id)
        assert set(out) == set(cases)
        # no synchronous call was made, and the lines took no TPM/RPM (tpm=100 fits none of them)
        stats = sim.stats("lab")
        assert stats["requests"] == 0 and stats["admitted_tokens"] == 0
        assert stats["batch"]["lines_answered"] == len(cases) and stats["batch"]["batches_completed"] == 1
        assert stats["batch"]["files_uploaded"] == 1  # the output file is not an upload
        assert sum(sim.answered().values()) == len(cases)

        with JudgeSim([Region("sync")]) as other:  # lab's tpm=100 admits none of these synchronously
            for cid, body in cases.items():
                status, sync = post(other.base_url("sync") + "/chat/completions", body)
                assert status == 200, sync
                line = out[cid]
                assert line["error"] is None and line["response"]["status_code"] == 200
                assert line["id"].startswith("batch_req_") and line["response"]["request_id"]
                same_reply(line["response"]["body"], sync)
        usage = [out[c]["response"]["body"]["usage"] for c in cases]
        assert batch.usage.input_tokens == sum(u["prompt_tokens"] for u in usage)
        assert batch.usage.output_tokens == sum(u["completion_tokens"] for u in usage)
        assert stats["batch"]["prompt_tokens"] == batch.usage.input_tokens
        assert stats["batch"]["completion_tokens"] == batch.usage.output_tokens
        assert usage[0]["prompt_tokens"] == 4 + tokens("You grade.") + 4 + tokens("Q: 2+2? A: 4 — ünï")
        assert out["cut"]["response"]["body"]["choices"][0]["finish_reason"] == "length"
        assert out["tools"]["response"]["body"]["choices"][0]["finish_reason"] == "tool_calls"
        assert json.loads(out["schema"]["response"]["body"]["choices"][0]["message"]["content"])["score"] in range(1, 6)


def test_azure_batch_uses_the_deployment_as_model_and_replies_like_the_deployment_path():
    with JudgeSim([Region("eu", batch_delay=0.2)]) as sim:
        client = azure(sim, "eu")
        cases = bodies("gpt-4o-batch")
        lines = [req(cid, body, url="/chat/completions") for cid, body in cases.items()]
        batch = wait(client, submit(client, lines, endpoint="/chat/completions").id)
        assert batch.status == "completed" and batch.request_counts.completed == len(cases)
        out = read_lines(client, batch.output_file_id)
        assert sim.stats("eu")["requests"] == 0
        url = sim.azure_endpoint("eu") + f"/openai/deployments/gpt-4o-batch/chat/completions?api-version={API_VERSION}"
        for cid, body in cases.items():
            status, sync = post(url, {k: v for k, v in body.items() if k != "model"})
            assert status == 200
            same_reply(out[cid]["response"]["body"], sync)
        # Azure's v1 API form, and the dated form without api-version
        v1 = openai.OpenAI(base_url=sim.azure_endpoint("eu") + "/openai/v1", api_key="x", max_retries=0)
        done = wait(v1, submit(v1, [req("a", cases["plain"])], endpoint="/v1/chat/completions").id)
        assert done.status == "completed" and sim.stats("eu")["batch"]["batches_completed"] == 2


def test_azure_dated_paths_need_api_version():
    with JudgeSim([Region("eu")]) as sim:
        url = sim.azure_endpoint("eu") + "/openai/batches"
        status, body = post(url, {"input_file_id": "file-x", "endpoint": "/chat/completions",
                                  "completion_window": "24h"})
        assert status == 400 and body["error"]["param"] == "api-version"
        assert sim.stats("eu")["batch"]["bad_request"] == 1


def test_files_round_trip_list_and_delete():
    with JudgeSim([Region("lab")]) as sim:
        client = oai(sim, "lab")
        data = jsonl([req("a", bodies("m")["plain"])]).replace(b"\n", b"\r\n")
        f = client.files.create(file=("crlf.jsonl", data), purpose="batch")
        assert (f.purpose, f.bytes, f.filename, f.status) == ("batch", len(data), "crlf.jsonl", "processed")
        assert client.files.retrieve(f.id).id == f.id and client.files.content(f.id).content == data
        assert [x.id for x in client.files.list(purpose="batch")] == [f.id]
        assert client.files.delete(f.id).deleted
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(f.id)
        with pytest.raises(openai.BadRequestError, match="jsonl"):
            client.files.create(file=("notes.txt", data), purpose="batch")
        assert sim.stats("lab")["batch"]["files_uploaded"] == 1


def test_batches_list_pages_newest_first():
    clock = Clock()
    with JudgeSim([Region("lab")], clock=clock) as sim:
        client = oai(sim, "lab")
        ids = [submit(client, [req("a", bodies("m")["plain"])]).id for _ in range(3)]
        page = client.batches.list(limit=2)
        assert [b.id for b in page.data] == ids[::-1][:2] and page.has_more
        assert [b.id for b in client.batches.list(limit=2)] == ids[::-1]  # the SDK follows `after`
        assert client.batches.list(after=ids[0]).data == []


# ---------------------------------------------------------------- failures, expiry, cancel

def test_fail_fraction_fails_the_lines_the_hash_picks_and_a_retry_draws_again():
    seed, fraction = 7, 0.3
    with JudgeSim([Region("lab", batch_delay=0.1, batch_fail_fraction=fraction)], seed=seed) as sim:
        client = oai(sim, "lab")
        ids = [f"job1:e0:{i}:0" for i in range(40)]
        lines = [req(cid, {"model": "m", "messages": user(f"item {cid}")}) for cid in ids]
        expected = {cid for cid in ids if fails(seed, cid, 0, fraction)}
        assert 0 < len(expected) < len(ids)
        batch = wait(client, submit(client, lines).id)
        assert batch.status == "completed"
        assert batch.request_counts.model_dump() == {"total": 40, "completed": 40 - len(expected),
                                                     "failed": len(expected)}
        errors, out = read_lines(client, batch.error_file_id), read_lines(client, batch.output_file_id)
        assert set(errors) == expected and set(out) == set(ids) - expected
        for line in errors.values():
            assert line["error"] is None and line["response"]["status_code"] == 500
            assert line["response"]["body"]["error"]["type"] == "server_error"
        # the failed lines again, in a second batch: attempt 1, a fresh draw
        retry = wait(client, submit(client, [x for x in lines if x["custom_id"] in expected]).id)
        again = {cid for cid in expected if fails(seed, cid, 1, fraction)}
        assert set(read_lines(client, retry.error_file_id)) == again
        stats = sim.stats("lab")["batch"]
        assert stats["lines_failed"] == len(expected) + len(again)
        assert stats["lines_answered"] == 40 - len(again) and sim.stats("lab")["requests"] == 0


def test_invalid_bodies_and_once_markers_are_answered_per_line_as_the_sync_endpoint_does():
    with JudgeSim([Region("lab", batch_delay=0.05)]) as sim:
        client = oai(sim, "lab")
        no_json = {"model": "m", "messages": user("no keyword"), "response_format": {"type": "json_object"}}
        once = {"model": "m", "messages": user("flaky [[sim:500-once]]")}
        limited = {"model": "m", "messages": user("[[sim:429]]")}
        first = wait(client, submit(client, [req("bad", no_json), req("once", once), req("429", limited)]).id)
        assert first.status == "completed" and first.request_counts.failed == 3
        errors = read_lines(client, first.error_file_id)
        status, sync = post(sim.base_url("lab") + "/chat/completions", no_json)
        assert status == errors["bad"]["response"]["status_code"] == 400
        assert errors["bad"]["response"]["body"] == sync
        assert errors["once"]["response"]["status_code"] == 500
        assert errors["429"]["response"]["status_code"] == 429
        retry = wait(client, submit(client, [req("once", once)]).id)
        assert retry.request_counts.completed == 1  # the -once fault fired the first time only


def test_expiry_answers_the_lines_due_in_time_and_expires_the_rest():
    clock = Clock()
    delay, expire, n = 10.0, 6.0, 4
    with JudgeSim([Region("lab", batch_delay=delay, batch_expire_after=expire)], clock=clock) as sim:
        client = oai(sim, "lab")
        ids = [f"c{i}" for i in range(n)]
        batch = submit(client, [req(cid, {"model": "m", "messages": user(cid)}) for cid in ids])
        assert batch.expires_at == batch.created_at + int(expire)
        clock.t += expire - 0.01
        assert client.batches.retrieve(batch.id).status == "in_progress"
        clock.t += 0.01
        batch = client.batches.retrieve(batch.id)
        # documented: p = min(0.1 d, 1); done by t = floor(N (t - p) / (d - 2p))
        p = min(0.1 * delay, 1.0)
        done = math.floor(n * (expire - p) / (delay - 2 * p))
        assert done == 2 and batch.status == "expired" and batch.expired_at is not None
        assert batch.request_counts.model_dump() == {"total": n, "completed": done, "failed": n - done}
        assert set(read_lines(client, batch.output_file_id)) == set(ids[:done])
        expired = read_lines(client, batch.error_file_id)
        assert set(expired) == set(ids[done:])
        for line in expired.values():
            assert line["response"] is None and line["error"]["code"] == "batch_expired"
        stats = sim.stats("lab")["batch"]
        assert stats["batches_expired"] == 1 and stats["lines_expired"] == n - done


def test_timeline_follows_the_clock():
    clock = Clock()
    delay, n = 20.0, 8
    with JudgeSim([Region("lab", batch_delay=delay)], clock=clock) as sim:
        client = oai(sim, "lab")
        batch = submit(client, [req(f"c{i}", {"model": "m", "messages": user(str(i))}) for i in range(n)])
        p = min(0.1 * delay, 1.0)
        for at, status, completed in ((0.5, "validating", 0), (1.0, "in_progress", 0),
                                      (10.0, "in_progress", math.floor(n * (10 - p) / (delay - 2 * p))),
                                      (19.0, "finalizing", n), (20.0, "completed", n)):
            clock.t = 1000.0 + at
            got = client.batches.retrieve(batch.id)
            assert (got.status, got.request_counts.completed) == (status, completed), at
        assert got.completed_at - got.created_at == int(delay)
        assert sim.stats("lab")["batch"]["batches_unfinished"] == 0


def test_cancel_keeps_the_answered_lines_and_cancels_the_rest():
    clock = Clock()
    with JudgeSim([Region("lab", batch_delay=10.0)], clock=clock) as sim:
        client = oai(sim, "lab")
        ids = [f"c{i}" for i in range(8)]
        batch = submit(client, [req(cid, {"model": "m", "messages": user(cid)}) for cid in ids])
        clock.t += 5.0
        done = math.floor(8 * (5.0 - 1.0) / (10.0 - 2.0))
        cancelling = client.batches.cancel(batch.id)
        assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
        clock.t += 20.0  # lines stop at the cancel
        batch = client.batches.retrieve(batch.id)
        assert batch.status == "cancelled" and batch.request_counts.completed == done == 4
        assert set(read_lines(client, batch.output_file_id)) == set(ids[:done])
        cancelled = read_lines(client, batch.error_file_id)
        assert {x["error"]["code"] for x in cancelled.values()} == {"batch_cancelled"}
        assert set(cancelled) == set(ids[done:])
        assert client.batches.cancel(batch.id).status == "cancelled"  # again: no change
        finished = submit(client, [req("z", {"model": "m", "messages": user("z")})])
        clock.t += 10.0
        assert client.batches.retrieve(finished.id).status == "completed"
        with pytest.raises(openai.BadRequestError, match="completed"):
            client.batches.cancel(finished.id)
        assert sim.stats("lab")["batch"]["batches_cancelled"] == 1


def test_enqueued_token_limit_fails_a_batch_that_would_pass_it_until_others_finish():
    clock = Clock()
    body = {"model": "gpt-4o-batch", "messages": user("x" * 40), "max_tokens": 100}
    each = estimate(body)  # 4 + 10 + 100
    limit = 3 * each
    with JudgeSim([Region("eu", batch_delay=10.0, enqueued_tokens=limit)], clock=clock) as sim:
        client = azure(sim, "eu")
        lines = [req(f"a{i}", body, url="/chat/completions") for i in range(2)]
        first = submit(client, lines, endpoint="/chat/completions")
        assert sim.stats("eu")["batch"]["enqueued_tokens"] == 2 * each
        second = submit(client, [req(f"b{i}", body, url="/chat/completions") for i in range(2)],
                        endpoint="/chat/completions")
        other_model = {**body, "model": "other-batch"}
        third = submit(client, [req("c", other_model, url="/chat/completions")], endpoint="/chat/completions")
        clock.t += 1.0
        refused = client.batches.retrieve(second.id)
        assert refused.status == "failed" and refused.request_counts.total == 0
        assert [e.code for e in refused.errors.data] == ["token_limit_exceeded"]
        assert str(limit) in refused.errors.data[0].message
        assert client.batches.retrieve(third.id).status == "in_progress"  # the limit is per model
        clock.t += 10.0
        assert client.batches.retrieve(first.id).status == "completed"
        fits = submit(client, [req(f"b{i}", body, url="/chat/completions") for i in range(3)],
                      endpoint="/chat/completions")
        clock.t += 10.0
        assert client.batches.retrieve(fits.id).status == "completed"
        stats = sim.stats("eu")
        assert stats["batch"]["peak_enqueued_tokens"] == 3 * each <= limit
        assert stats["batch"]["batches_failed"] == 1 and stats["batch"]["enqueued_tokens"] == 0
        assert stats["requests"] == 0


# ---------------------------------------------------------------- keys and bad input

def test_batch_endpoints_check_the_key_like_chat_and_never_log_it():
    log = io.StringIO()
    with JudgeSim([Region("k", batch_delay=0.05)], api_key="s3cret-key", log=log) as sim:
        wrong = oai(sim, "k", api_key="wrong-key-123")
        with pytest.raises(openai.AuthenticationError):
            wrong.files.create(file=("r.jsonl", b"{}\n"), purpose="batch")
        with pytest.raises(openai.AuthenticationError):
            wrong.batches.list()
        with pytest.raises(openai.AuthenticationError):
            azure(sim, "k", api_key="wrong-key-123").batches.retrieve("batch_x")
        good = azure(sim, "k", api_key="s3cret-key")
        batch = wait(good, submit(good, [req("a", {"model": "d", "messages": user("hi")}, "/chat/completions")],
                                  endpoint="/chat/completions").id)
        assert batch.status == "completed"
        with pytest.raises(openai.AuthenticationError):
            wrong.files.content(batch.output_file_id)
        stats = sim.stats("k")
        assert stats["batch"]["unauthorized"] == 4 and stats["unauthorized"] == 0
    text = log.getvalue()
    assert " 401" in text and "/v1/files" in text
    assert "s3cret" not in text and "wrong-key" not in text


def test_malformed_input_files_fail_the_batch_with_the_apis_errors():
    with JudgeSim([Region("lab", batch_delay=0.05)]) as sim:
        client = oai(sim, "lab")
        ok = {"model": "m", "messages": user("hi")}
        lines = [req("a", ok), "{not json", req("a", ok), {"custom_id": "c", "url": CHAT, "body": ok},
                 req("d", ok, url="/chat/completions"), req("e", {**ok, "model": "other"}),
                 {**req("f", ok), "method": "GET"}, req("g", {"messages": user("no model")})]
        batch = wait(client, submit(client, lines).id)
        assert batch.status == "failed" and batch.failed_at is not None
        assert batch.output_file_id is None and batch.error_file_id is None
        got = [(e.line, e.code) for e in batch.errors.data]
        assert got == [(2, "invalid_json_line"), (3, "duplicate_custom_id"), (4, "missing_required_parameter"),
                       (5, "url_mismatch"), (6, "model_mismatch"), (7, "invalid_value"),
                       (8, "missing_required_parameter")]
        assert batch.errors.data[2].param == "method" and batch.errors.data[6].param == "body.model"
        empty = wait(client, submit(client, []).id)
        assert [e.code for e in empty.errors.data] == ["empty_file"]
        with pytest.raises(openai.BadRequestError):
            client.batches.create(input_file_id="file-nope", endpoint=CHAT, completion_window="24h")
        f = client.files.create(file=("r.jsonl", jsonl([req("a", ok)])), purpose="batch")
        with pytest.raises(openai.BadRequestError, match="endpoint"):
            client.batches.create(input_file_id=f.id, endpoint="/chat/completions", completion_window="24h")
        with pytest.raises(openai.BadRequestError, match="completion_window"):
            client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="1h")
        stats = sim.stats("lab")["batch"]
        assert stats["batches_failed"] == 2 and stats["bad_request"] == 3 and stats["lines_answered"] == 0


# ---------------------------------------------------------------- configuration

def test_region_specs_take_batch_settings_over_the_defaults():
    defaults = {"batch_delay": 2.0, "enqueued_tokens": 500}
    r = parse_region("eu:1000:10:batch_delay=0.5:batch_fail_fraction=0.25", defaults)
    assert (r.tpm, r.rpm, r.port, r.batch_delay, r.batch_fail_fraction, r.enqueued_tokens) == (
        1000, 10, 0, 0.5, 0.25, 500)
    r = parse_region("eu:0:0:8080:batch_expire_after=30:enqueued_tokens=0")
    assert (r.port, r.batch_expire_after, r.enqueued_tokens, r.batch_delay) == (8080, 30.0, 0, 1.0)
    for bad in ("eu:1:1:colour=blue", "eu:1:1:batch_delay=soon", "eu:1:1:batch_fail_fraction=2"):
        with pytest.raises(ValueError):
            parse_region(bad)
    result = CliRunner().invoke(judge_sim_command, ["--region", "lab:1:1:nope=1"])
    assert result.exit_code == 2 and "nope" in result.output
    with pytest.raises(ValueError):
        Region("x", batch_expire_after=0)


def test_cli_serves_batches_with_its_batch_options():
    proc = subprocess.Popen(
        [sys.executable, "-m", "evalq.sim", "--region", "lab:0:0", "--region", "eu:0:0:enqueued_tokens=0",
         "--batch-delay", "0.1", "--batch-fail-fraction", "1", "--enqueued-tokens", "1000"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        urls = dict(proc.stdout.readline().split() for _ in range(2))
        body = {"model": "m", "messages": user("hi"), "max_tokens": 600}
        for name, status in (("lab", "failed"), ("eu", "completed")):
            client = openai.OpenAI(base_url=urls[name], api_key="x", max_retries=0)
            lines = [req(f"{name}{i}", body) for i in range(2)]  # 2 * 605 > 1000 enqueued tokens
            batch = wait(client, submit(client, lines).id)
            assert batch.status == status, name
        assert batch.request_counts.failed == 2  # --batch-fail-fraction 1 in eu too
    finally:
        proc.terminate()
        proc.wait(timeout=5)
