"""The Batch API path's pieces on a real Redis: a call registered once per job as a line
(never after its reply is in), parked chunks woken once and only when every call they wait
for is resolved, a metric's independent questions all asked before the wait, and results'
accounting by path. The whole path runs in tests/integration/test_batch_mode.py."""

from __future__ import annotations

import json

import pytest
import redis

from evalq.results.summary import judge_accounting
from evalq.orchestrator.parking import batch_view, park, waits_for_batches, wake, waiting
from evalq.shared.cluster import keys
from evalq.shared.core.errors import MetricError, Pending
from evalq.shared.judging.judges import JudgeConfig
from evalq.workers.judge.batch_lines import BatchLines
from evalq.workers.metrics.structured import each

JOB = "unit-batch-job"


def judge(batch: bool = True) -> JudgeConfig:
    return JudgeConfig.model_validate({
        "provider": "openai", "model": "m", "api_key_env": "K", "max_tokens": 50,
        "deployments": [{"region": "sync", "base_url": "http://127.0.0.1:1/v1", "tpm": 1000, "rpm": 10},
                        {"region": "eu", "base_url": "http://127.0.0.1:2/v1", "tpm": 1000, "rpm": 10,
                         **({"batch": {"enqueued_tokens": 10_000}} if batch else {})}]})


@pytest.fixture
def r(private_redis):
    client = redis.Redis.from_url(private_redis)
    client.set(keys.status(JOB), "running")
    return client


def lines(r) -> BatchLines:
    config = judge()
    return BatchLines(r, JOB, "m0", "j", config, list(config.deployments))


def test_a_call_becomes_one_line_per_job_and_never_after_its_reply(r):
    bl = lines(r)
    assert bl.deployment.region == "eu"  # the batch-capable deployment, whatever the order
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}
    from evalq.workers.judge.cost import Hold

    assert bl.register("a" * 64, body, item=3, held=Hold("h1", 7), counted=9) == 1
    assert bl.register("a" * 64, body, item=4) == 0  # another item asks the same: it waits with it
    assert r.lrange(keys.batch(JOB, "queued:eu"), 0, -1) == [b"a" * 64]
    line = json.loads(r.hget(keys.batch(JOB, "line"), "a" * 64))
    assert (line["e"], line["j"], line["i"], line["h"], line["k"], line["n"], line["r"]) == \
        ("m0", "j", 3, ["h1", 7], 9, 0, "eu")
    assert line["t"] >= 50 and r.sismember(keys.BATCH_JOBS, JOB)
    r.hset(keys.judge_memo(JOB), "b" * 64, "{}")
    r.hset(keys.batch(JOB, "sync"), "c" * 64, "why")
    assert bl.register("b" * 64, body, item=0) == -1  # answered meanwhile: never a second batch
    assert bl.register("c" * 64, body, item=0) == -1  # sent synchronously instead
    assert r.llen(keys.batch(JOB, "queued:eu")) == 1
    assert bl.sync_reason("c" * 64) == "why" and bl.sync_reason("a" * 64) is None


def test_auto_past_its_deadline_sends_synchronously(r):
    config = judge()
    late = BatchLines(r, JOB, "m0", "j", config, list(config.deployments), deadline=1.0)
    assert late.past_deadline() and late.sync_reason("a" * 64) == "the auto deadline passed"
    with pytest.raises(ValueError, match="no deployment that declares 'batch'"):
        BatchLines(r, JOB, "m0", "j", judge(batch=False), list(judge(batch=False).deployments))


def test_parked_chunks_wake_once_every_call_they_wait_for_is_resolved(r, private_redis):
    from evalq.orchestrator.app import client_app

    app = client_app(private_redis)
    for digest in ("d1", "d2", "d3"):
        r.hset(keys.batch(JOB, "line"), digest, "{}")
    park(app, r, JOB, "m0", 0, 4, "eu", "judge.eu", ["d1", "d2"])
    park(app, r, JOB, "m0", 4, 8, "eu", "judge.eu", ["d3"])
    assert waits_for_batches(r, JOB) and waiting(r, JOB, ["d1", "d2", "d3", "zz"]) == {"d1", "d2", "d3"}
    r.hdel(keys.batch(JOB, "line"), "d1", "d3")  # answered
    assert wake(app, r, JOB) == 1  # only the chunk whose calls are all back
    assert json.loads(r.lpop(keys.pending(JOB, "judge.eu"))) == ["m0", 4, 8, "eu"]
    assert wake(app, r, JOB) == 0  # woken once
    r.hdel(keys.batch(JOB, "line"), "d2")
    assert wake(app, r, JOB) == 1 and not waits_for_batches(r, JOB)
    assert json.loads(r.lpop(keys.pending(JOB, "judge.eu"))) == ["m0", 0, 4, "eu"]


def test_a_chunk_parking_after_its_replies_came_is_woken_at_once(r, private_redis):
    from evalq.orchestrator.app import client_app

    park(client_app(private_redis), r, JOB, "m0", 0, 4, "eu", "judge.eu", ["gone"])
    assert r.hlen(keys.parked(JOB)) == 0 and r.llen(keys.pending(JOB, "judge.eu")) == 1


def test_a_job_that_ended_drops_its_parked_chunks(r, private_redis):
    from evalq.orchestrator.app import client_app

    app = client_app(private_redis)
    r.hset(keys.batch(JOB, "line"), "d1", "{}")
    park(app, r, JOB, "m0", 0, 4, "eu", "judge.eu", ["d1"])
    r.set(keys.status(JOB), "cancelled")
    assert wake(app, r, JOB) == 0 and r.hlen(keys.parked(JOB)) == 0 and r.llen(keys.pending(JOB, "judge.eu")) == 0


def test_status_shows_each_batch(r):
    assert batch_view(r, JOB) is None
    r.hset(keys.batch(JOB, "line"), "d1", "{}")
    r.hset(keys.batch(JOB, "open"), "x", json.dumps({
        "id": "x", "provider": "batch_1", "region": "eu", "judge": "j", "state": "in_progress", "lines": 5,
        "completed": 2, "failed": 1, "tokens": 900, "created": 1_700_000_000, "expected_end": 1_700_000_600}))
    view = batch_view(r, JOB)
    assert view["waiting_lines"] == 1 and view["parked_chunks"] == 0
    assert view["batches"] == [{"id": "batch_1", "region": "eu", "judge": "j", "state": "in_progress", "lines": 5,
                                "completed": 2, "failed": 1, "tokens": 900, "created_at": "2023-11-14T22:13:20+00:00",
                                "expected_end": "2023-11-14T22:23:20+00:00", "ended_at": None}]


def test_independent_questions_are_all_asked_before_the_wait():
    asked = []

    def question(n: int, wait: bool):
        def ask():
            asked.append(n)
            if wait:
                raise Pending(f"d{n}")
            return n * 10
        return ask

    assert each([question(1, False), question(2, False)]) == [10, 20]
    asked.clear()
    with pytest.raises(Pending) as info:
        each([question(1, True), question(2, False), question(3, True)])
    assert asked == [1, 2, 3] and info.value.digests == ["d1", "d3"]
    with pytest.raises(MetricError):  # anything else stops at once, as asking in turn would
        each([lambda: (_ for _ in ()).throw(MetricError("bad")), question(9, False)])


def test_results_count_both_paths_and_show_each():
    acct = {b"calls": b"10", b"prompt_tokens": b"1000", b"completion_tokens": b"100", b"cost_nano": b"3000000000",
            b"batch_calls": b"8", b"batch_prompt_tokens": b"800", b"batch_completion_tokens": b"80",
            b"batch_cost_nano": b"1000000000", b"batch_failed_lines": b"3",
            b"eu/calls": b"10", b"eu/batch_calls": b"8", b"eu/cost_nano": b"3000000000",
            b"eu/batch_cost_nano": b"1000000000"}
    j = judge_accounting(acct, priced=True)
    assert j["calls"] == 10 and j["cost"] == 3.0
    assert j["by_path"] == {"sync": {"calls": 2, "prompt_tokens": 200, "completion_tokens": 20, "cost": 2.0},
                            "batch": {"calls": 8, "prompt_tokens": 800, "completion_tokens": 80, "failed_lines": 3,
                                      "cost": 1.0}}
    assert j["regions"]["eu"] == {"calls": 10, "batch_calls": 8, "cost": 3.0, "batch_cost": 1.0}
    plain = judge_accounting({b"calls": b"2", b"cost_nano": b"5", b"eu/calls": b"2"}, priced=True)
    assert "by_path" not in plain and plain["regions"]["eu"] == {"calls": 2, "cost": 0.0}
