"""The Batch API client (evalq.workers.judge.batch_api) against judge-sim's Files and
Batches over real loopback HTTP with the real ``openai`` SDK, in OpenAI's and Azure
OpenAI's shapes: replies equal to the synchronous judge client's, failed, expired and
cancelled lines, a batch failed whole, and an endpoint off the allow-list never contacted.

The sim runs on a clock of the test's own (``JudgeSim(clock=...)``), so batches move on
without waiting. Expected values come from the sim's documented rules, not from the
client under test."""

from __future__ import annotations

import hashlib
import json
import math
import os
import uuid

import pytest
import redis

from evalq.shared.policy.endpoints import EndpointPolicy
from evalq.shared.judging.judges import JudgeConfig, JudgingOptions
from evalq.sim import JudgeSim, Region
from evalq.workers.judge.batch_api import BatchApiError, BatchClient, CallRef, LineError, index_calls, parse_custom_id
from evalq.workers.judge.client import JudgeClient, JudgeError, chat_request
from evalq.shared.judging.judge_reply import Reply
from tests.integration.test_security import Trap

pytestmark = pytest.mark.integration

SECRET = "sk-evalq-batch-" + uuid.uuid4().hex
KEY_ENV = "TEST_BATCH_API_KEY"
SEED = 11
API_VERSION = "2024-10-21"
SCHEMA = {"type": "object", "properties": {"score": {"type": "integer", "minimum": 1, "maximum": 5},
                                            "reason": {"type": "string"}},
          "required": ["score", "reason"], "additionalProperties": False}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def clock():
    return Clock()


@pytest.fixture(scope="module")
def sim(clock):
    os.environ[KEY_ENV] = SECRET
    regions = [Region("lab", batch_delay=10), Region("flaky", batch_delay=10, batch_fail_fraction=0.5),
               Region("slow", batch_delay=100, batch_expire_after=50), Region("tight", enqueued_tokens=10)]
    with JudgeSim(regions, api_key=SECRET, seed=SEED, clock=clock) as s:
        yield s
    os.environ.pop(KEY_ENV, None)


def openai_judge(sim, output="json_schema", regions=("lab",)) -> JudgeConfig:
    return JudgeConfig.model_validate({
        "provider": "openai", "model": "judge-sim", "api_key_env": KEY_ENV, "output": output, "max_tokens": 100,
        "max_retries": 0, "timeout": 5,
        "deployments": [{"region": r, "base_url": sim.base_url(r), "tpm": 10_000_000, "rpm": 100_000,
                         "batch": {"enqueued_tokens": 50_000_000}} for r in regions]})


def azure_judge(sim, batch_deployment=None) -> JudgeConfig:
    batch = {"enqueued_tokens": 50_000_000, **({"deployment": batch_deployment} if batch_deployment else {})}
    return JudgeConfig.model_validate({
        "provider": "azure", "model": "gpt-4o", "api_key_env": KEY_ENV, "api_version": API_VERSION,
        "max_tokens": 100, "max_retries": 0, "timeout": 5,
        "deployments": [{"region": "lab", "endpoint": sim.azure_endpoint("lab"), "deployment": "judge-dep",
                         "tpm": 10_000_000, "rpm": 100_000, "batch": batch}]})


def messages(i: int, tag: str) -> list[dict]:
    return [{"role": "system", "content": "Grade the answer from 1 to 5. Reply in JSON."},
            {"role": "user", "content": f"Answer {i} ({tag}) [[sim:score={1 + i % 5}]]"}]


def calls(judge: JudgeConfig, n: int, tag: str, job: str = "job1", entry: str = "coherence@0"):
    """(refs, lines): n judge calls, keyed like the judge client keys them."""
    refs, lines = [], []
    for i in range(n):
        body = chat_request(judge, messages(i, tag), SCHEMA if judge.output != "text" else None)
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        ref = CallRef(job, entry, i, digest)
        refs.append(ref)
        lines.append((ref.custom_id, body))
    return refs, lines


def prompt_tokens(msgs: list[dict]) -> int:
    """judge-sim's documented count: per message 4 + ceil(utf-8 bytes / 4)."""
    return sum(4 + math.ceil(len(m["content"].encode()) / 4) for m in msgs)


def until_ended(client: BatchClient, batch_id: str, clock: Clock, step: float = 5.0, limit: int = 100):
    for _ in range(limit):
        status = client.status(batch_id)
        if status.ended:
            return status
        clock.t += step
    raise AssertionError(f"batch {batch_id} never ended")


def sync_reply(redis_url: str, judge: JudgeConfig, msgs: list[dict]) -> Reply:
    """What the synchronous judge client answers for the same call (no cache, no memo)."""
    client = JudgeClient(redis.Redis.from_url(redis_url), "sync" + uuid.uuid4().hex[:8], "coherence@0", "sim",
                         judge, JudgingOptions(cache=False))
    return client.complete(msgs, SCHEMA if judge.output != "text" else None)


def score_of(reply: Reply) -> int:
    text = reply.text()
    return json.loads(text)["score"] if text.lstrip().startswith("{") else int(text.rsplit("Score:", 1)[1])


@pytest.mark.parametrize("output", ["json_schema", "tools", "text"])
def test_openai_batch_replies_equal_the_synchronous_ones(sim, clock, redis_url, output):
    judge = openai_judge(sim, output)
    tag = uuid.uuid4().hex
    refs, lines = calls(judge, 7, tag)
    client = BatchClient(judge, judge.deployments[0])
    started = client.submit(lines, metadata={"evalq_job": "job1"})
    assert started.state in ("validating", "in_progress") and not started.ended
    assert started.metadata == {"evalq_job": "job1"}
    status = until_ended(client, started.id, clock)
    assert (status.state, status.total, status.completed, status.failed) == ("completed", 7, 7, 0)
    outcomes = client.results(status, expected=[cid for cid, _ in lines])
    index = index_calls(refs)
    assert set(outcomes) == set(index)
    for cid, outcome in outcomes.items():
        i = index[cid].item
        assert parse_custom_id(cid).matches(index[cid])
        assert isinstance(outcome, Reply), outcome
        want = sync_reply(redis_url, judge, messages(i, tag))
        assert (outcome.content, outcome.tool_arguments, outcome.usage) == \
            (want.content, want.tool_arguments, want.usage)
        assert score_of(outcome) == 1 + i % 5
        assert outcome.usage["prompt_tokens"] == prompt_tokens(messages(i, tag))
        assert (outcome.tool_arguments is not None) == (output == "tools")


@pytest.mark.parametrize("batch_deployment", [None, "judge-global-batch"])
def test_azure_batch_names_the_batch_deployment_and_replies_like_it(sim, clock, redis_url, batch_deployment):
    judge = azure_judge(sim, batch_deployment)
    tag = uuid.uuid4().hex
    refs, lines = calls(judge, 4, tag)
    client = BatchClient(judge, judge.deployments[0])
    status = until_ended(client, client.submit(lines).id, clock)
    assert status.state == "completed"
    # the input file as the provider stored it: Azure's url, the batch deployment as model
    batch = client.sdk.batches.retrieve(status.id)
    sent = [json.loads(x) for x in client.file_content(batch.input_file_id).splitlines()]
    assert {(s["url"], s["body"]["model"]) for s in sent} == {("/chat/completions",
                                                               batch_deployment or "judge-dep")}
    # the synchronous reply of the deployment that answered (sim replies depend on it)
    answering = judge.model_copy(update={"deployments": [judge.deployments[0].model_copy(
        update={"deployment": batch_deployment or "judge-dep"})]})
    outcomes = client.results(status, expected=[cid for cid, _ in lines])
    for ref in refs:
        want = sync_reply(redis_url, answering, messages(ref.item, tag))
        got = outcomes[ref.custom_id]
        assert isinstance(got, Reply) and (got.content, got.usage) == (want.content, want.usage)
        assert score_of(got) == 1 + ref.item % 5


def fails(custom_id: str, attempt: int, fraction: float = 0.5) -> bool:
    """judge-sim's documented rule for batch_fail_fraction."""
    digest = hashlib.sha256(f"{SEED}:{custom_id}:{attempt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2 ** 64 < fraction


def test_failed_lines_are_errors_and_a_retry_batch_answers_them(sim, clock):
    judge = openai_judge(sim, regions=("flaky",))
    refs, lines = calls(judge, 16, "fixed", job="flaky-job")  # fixed ids: the draws below are fixed too
    client = BatchClient(judge, judge.deployments[0])
    status = until_ended(client, client.submit(lines).id, clock)
    expect_failed = {cid for cid, _ in lines if fails(cid, 0)}
    assert 0 < len(expect_failed) < 16 and any(not fails(cid, 1) for cid in expect_failed)
    assert (status.state, status.completed, status.failed) == ("completed", 16 - len(expect_failed),
                                                               len(expect_failed))
    outcomes = client.results(status, expected=[cid for cid, _ in lines])
    failed = {cid for cid, o in outcomes.items() if isinstance(o, LineError)}
    assert failed == expect_failed
    for cid in failed:
        err = outcomes[cid]
        assert (err.kind, err.status_code, err.retryable) == ("failed", 500, True)
    # the failed lines again, in the next batch: the sim draws again (attempt 1)
    again = [(cid, body) for cid, body in lines if cid in failed]
    retry = until_ended(client, client.submit(again).id, clock)
    second = client.results(retry, expected=[cid for cid, _ in again])
    assert {cid for cid, o in second.items() if isinstance(o, Reply)} == {cid for cid in failed if not fails(cid, 1)}


def test_an_expired_batch_answers_the_lines_done_in_time_and_expires_the_rest(sim, clock):
    judge = openai_judge(sim, regions=("slow",))
    refs, lines = calls(judge, 10, uuid.uuid4().hex)
    client = BatchClient(judge, judge.deployments[0])
    status = until_ended(client, client.submit(lines).id, clock)
    assert status.state == "expired"
    outcomes = client.results(status, expected=[cid for cid, _ in lines])
    assert set(outcomes) == {cid for cid, _ in lines}  # every line ends with a value or an error
    # the sim answers floor(N (t - p) / (delay - 2p)) lines by t = expire_after, p = 1 s
    answered = math.floor(10 * (50 - 1) / (100 - 2))
    replies = [o for o in outcomes.values() if isinstance(o, Reply)]
    expired = [o for o in outcomes.values() if isinstance(o, LineError)]
    assert (len(replies), len(expired)) == (answered, 10 - answered)
    assert {(e.kind, e.code, e.retryable) for e in expired} == {("expired", "batch_expired", True)}


def test_cancel_stops_a_batch_and_keeps_what_was_answered(sim, clock):
    judge = openai_judge(sim)
    refs, lines = calls(judge, 8, uuid.uuid4().hex)
    client = BatchClient(judge, judge.deployments[0])
    started = client.submit(lines)
    clock.t += 5.0  # half-way: lines answered = floor(8 (5 - 1) / (10 - 2)) = 4
    running = client.status(started.id)
    assert (running.state, running.completed) == ("in_progress", 4)
    assert running.expected_end(now=running.in_progress_at + 4) is not None
    assert client.cancel(started.id).state == "cancelling"
    status = until_ended(client, started.id, clock, step=1.0)
    assert status.state == "cancelled"
    outcomes = client.results(status, expected=[cid for cid, _ in lines])
    kinds = sorted(o.kind if isinstance(o, LineError) else "reply" for o in outcomes.values())
    assert kinds == ["cancelled"] * 4 + ["reply"] * 4


def test_a_batch_failed_whole_gives_every_line_its_error(sim, clock):
    judge = openai_judge(sim, regions=("tight",))  # the region's enqueued-token limit is 10
    refs, lines = calls(judge, 3, uuid.uuid4().hex)
    client = BatchClient(judge, judge.deployments[0])
    status = until_ended(client, client.submit(lines).id, clock, step=1.0)
    assert status.state == "failed" and "token_limit_exceeded" in status.error_codes
    outcomes = client.results(status, expected=[cid for cid, _ in lines])
    assert {(o.kind, o.code) for o in outcomes.values()} == {("failed", "token_limit_exceeded")}


@pytest.fixture
def trap():
    t = Trap()
    yield t
    t.close()


def test_an_endpoint_off_the_allow_list_is_refused_before_anything_is_sent(sim, trap):
    judge = JudgeConfig.model_validate({
        "provider": "openai", "model": "m", "api_key_env": KEY_ENV, "timeout": 3,
        "deployments": [{"region": "trap", "base_url": trap.url, "tpm": 1000, "rpm": 10,
                         "batch": {"enqueued_tokens": 1000}}]})
    only_sim = EndpointPolicy.parse(f"{KEY_ENV}={sim.base_url('lab')}")
    with pytest.raises(JudgeError, match="is not an endpoint"):
        BatchClient(judge, judge.deployments[0], policy=only_sim)
    # the worker's own EVALQ_ENDPOINTS (the test suite's: http://127.0.0.1:*) does not name localhost
    elsewhere = judge.model_copy(update={"deployments": [judge.deployments[0].model_copy(
        update={"base_url": trap.url.replace("127.0.0.1", "localhost")})]})
    with pytest.raises(JudgeError, match="is not an endpoint"):
        BatchClient(elsewhere, elsewhere.deployments[0])
    assert trap.received == []
    # and an allowed one is reached (the trap answers nothing, so the upload fails there)
    allowed = BatchClient(judge, judge.deployments[0], policy=EndpointPolicy.parse(f"{KEY_ENV}={trap.url}"))
    with pytest.raises(BatchApiError) as refused:
        allowed.upload(b'{"x": 1}\n')
    assert refused.value.retryable
    assert b"".join(trap.received).startswith(b"POST /v1/files")


def test_an_output_file_is_read_within_its_lines_bound_and_foreign_lines_are_passed_over(sim, clock, monkeypatch):
    """A batch's output is read streamed, up to what its lines can take (and the operator's
    EVALQ_BATCH_OUTPUT_MAX_BYTES): a larger file is not read, its lines fail (and go into another
    batch). A line for a custom_id evalq did not send is passed over before its reply is read."""
    from evalq.workers.judge.batch_api import OUTPUT_MAX_ENV, line_bound, read_outcomes

    judge = openai_judge(sim)
    refs, lines = calls(judge, 5, uuid.uuid4().hex)
    client = BatchClient(judge, judge.deployments[0])
    status = until_ended(client, client.submit(lines).id, clock)
    expected = [cid for cid, _ in lines]
    whole = client.file_content(status.output_file_id)
    assert all(isinstance(o, Reply) for o in client.results(status, expected=expected).values())
    monkeypatch.setenv(OUTPUT_MAX_ENV, str(len(whole) - 1))
    cut = client.results(status, expected=expected)
    assert set(cut) == set(expected)
    assert all(isinstance(o, LineError) and o.code == "output_too_large" and OUTPUT_MAX_ENV in o.message
               for o in cut.values()), cut
    # foreign and oversized lines are skipped; the expected ones read as before
    foreign = json.dumps({"custom_id": "ev1-someone-else", "response": {"status_code": 200, "body": {}}})
    huge = json.dumps({"custom_id": expected[0], "pad": "x" * (line_bound(judge) + 1)})
    mixed = read_outcomes(whole + f"\n{foreign}\n{huge}\n".encode(), set(expected[1:]), line_bound(judge))
    assert set(mixed) == set(expected[1:])
