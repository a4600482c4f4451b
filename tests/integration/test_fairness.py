"""Many jobs, one cluster: dispatch in windows, strict precedence between priority classes,
weighted fair share between tenants and jobs, tenant caps, work conservation, and what a
cancel, a lost refill or a worker does to them. Real Redis and real Celery messages; the
dispatch-order tests drive the chunks' completion by hand (a stand-in for a worker that
takes each message off the list and finishes it) so the order is exact on any machine, and
one test runs real workers end to end."""

from __future__ import annotations

import base64
import json

import pytest
import redis

from evalq.orchestrator.app import client_app
from evalq.orchestrator.broker import message_job
from evalq.orchestrator.stages import chunk_finished
from evalq.orchestrator.submit import submit
from evalq.shared.cluster import keys
from evalq.shared.job.schema import parse_job
from tests.conftest import read_results, start_worker, stop_worker, wait_for_worker
from tests.integration.test_sweeper import wait_for

pytestmark = pytest.mark.integration


def job(n: int, priority: str = "normal", tenant: str = "default", weight: float = 1.0, seconds: float = 0.0):
    """``n`` chunks of one item each of the test plugin's ``slow_len`` on the cpu queue."""
    return parse_job({"instances": [{"id": f"i{k}", "actual-output": "x" * (k % 5)} for k in range(n)],
                      "metrics": [{"id": "slow_len", "parameters": {"seconds": seconds}}],
                      "scheduling": {"priority": priority, "tenant": tenant, "weight": weight}})


def start(r: redis.Redis, url: str, tmp_path, name: str, spec_job) -> str:
    return submit(r, url, spec_job, chunk_size=1, out=str(tmp_path / name))


def finish_one(r: redis.Redis, url: str, queue: str = "cpu") -> str | None:
    """What a worker does with the oldest message: take it, finish its chunk (its slot frees,
    the queue refills). Returns the job it was for."""
    raw = r.rpop(queue)
    if raw is None:
        return None
    args = chunk_args(raw)
    chunk_finished(client_app(url), r, args[0], args[1], args[2], queue)
    return args[0]


def chunk_args(raw: bytes) -> list:
    """(job, metric key, start, stop) of a score_chunk message on a queue's list."""
    return json.loads(base64.b64decode(json.loads(raw)["body"]))[0]


def on_list(r: redis.Redis, queue: str = "cpu") -> list[str]:
    return [message_job(raw) for raw in r.lrange(queue, 0, -1)]


@pytest.fixture
def window(monkeypatch):
    monkeypatch.setenv("EVALQ_WINDOW", "3")
    monkeypatch.delenv("EVALQ_TENANTS", raising=False)
    return 3


def test_the_broker_holds_a_window_not_a_plan(private_redis, tmp_path, window):
    r = redis.Redis.from_url(private_redis)
    big = start(r, private_redis, tmp_path, "big", job(200))
    assert r.llen("cpu") == window  # one job alone fills the window (work conserving) ...
    assert r.llen(keys.pending(big, "cpu")) == 200 - window  # ... and the rest of its plan waits in Redis
    assert int(r.get(keys.sched("cpu", "out"))) == window
    assert int(r.get(keys.backlog("cpu"))) == 200


def test_a_higher_class_goes_first_for_chunks_not_yet_started(private_redis, tmp_path, window):
    r = redis.Redis.from_url(private_redis)
    low = start(r, private_redis, tmp_path, "low", job(20, priority="low"))
    normal = start(r, private_redis, tmp_path, "normal", job(5))
    high = start(r, private_redis, tmp_path, "high", job(5, priority="high"))
    assert on_list(r) == [low] * window  # sent before the others came: not pre-empted
    finished = [finish_one(r, private_redis) for _ in range(3 + 5 + 5)]
    sent = finished[window:]  # what went out after the first window: in class order
    assert sent[:5] == [high] * 5 and sent[5:10] == [normal] * 5, sent
    assert set(on_list(r)) == {low}


def test_weights_between_tenants_then_between_a_tenants_jobs(private_redis, tmp_path, window, monkeypatch):
    """search=2, ads=1: search's jobs get two thirds of the chunks while all run; within ads,
    a job of weight 3 gets three quarters of ads' share."""
    monkeypatch.setenv("EVALQ_TENANTS", "search=2,ads=1")
    r = redis.Redis.from_url(private_redis)
    s1 = start(r, private_redis, tmp_path, "s1", job(300, tenant="search"))
    a1 = start(r, private_redis, tmp_path, "a1", job(300, tenant="ads", weight=3))
    a2 = start(r, private_redis, tmp_path, "a2", job(300, tenant="ads", weight=1))
    for _ in range(40):  # the start-up window settles
        finish_one(r, private_redis)
    counts = {s1: 0, a1: 0, a2: 0}
    for _ in range(240):
        counts[finish_one(r, private_redis)] += 1
    assert counts[s1] == pytest.approx(160, abs=4)
    assert counts[a1] == pytest.approx(60, abs=4) and counts[a2] == pytest.approx(20, abs=4)


def test_a_share_nobody_uses_goes_to_the_others(private_redis, tmp_path, window):
    r = redis.Redis.from_url(private_redis)
    first = start(r, private_redis, tmp_path, "first", job(6, tenant="a"))
    second = start(r, private_redis, tmp_path, "second", job(40, tenant="b"))
    seen = [finish_one(r, private_redis) for _ in range(30)]
    assert seen.count(first) == 6  # its whole plan, fairly interleaved
    assert seen[-10:] == [second] * 10  # then the other has the queue to itself
    assert r.llen("cpu") == window


def test_a_tenant_cap_limits_its_share_of_a_judge_queues_tpm(private_redis, tmp_path, window, monkeypatch):
    monkeypatch.setenv("EVALQ_TENANTS", "ads.max_share=0.5")
    monkeypatch.setenv("TEST_CAP_API_KEY", "k")
    monkeypatch.setenv("EVALQ_WINDOW", "10")
    r = redis.Redis.from_url(private_redis)

    def judge_job(tenant: str):
        return parse_job({
            "instances": [{"id": f"i{k}", "input": "q", "actual-output": "a"} for k in range(20)],
            "judges": {"j": {"provider": "openai", "model": "m", "api_key_env": "TEST_CAP_API_KEY", "max_tokens": 100,
                             "deployments": [{"region": "cap", "base_url": "http://127.0.0.1:9/v1",
                                              "tpm": 4000, "rpm": 100}]}},
            "metrics": [{"id": "coherence", "parameters": {"judge": "j"}}],
            "scheduling": {"tenant": tenant}})

    ads = submit(r, private_redis, judge_job("ads"), out=str(tmp_path / "ads"))
    # a chunk of 4 items is estimated at 4 x (100 + 400) tokens: half of 4,000 TPM is one chunk a minute
    assert on_list(r, "judge.cap") == [ads]
    other = submit(r, private_redis, judge_job("search"), out=str(tmp_path / "search"))
    assert on_list(r, "judge.cap").count(other) == 5  # uncapped: the rest of the window
    r.delete("judge.cap")


def test_cancel_frees_its_window_at_once(private_redis, tmp_path, window):
    from evalq.orchestrator.jobs import cancel_job

    r = redis.Redis.from_url(private_redis)
    doomed = start(r, private_redis, tmp_path, "doomed", job(50))
    other = start(r, private_redis, tmp_path, "other", job(50))
    assert set(on_list(r)) == {doomed}
    cancel_job(r, private_redis, doomed)
    assert on_list(r) == [other] * window
    assert not r.exists(keys.pending(doomed, "cpu"))


def test_a_refill_lost_with_a_worker_is_made_by_the_sweep(private_redis, tmp_path, window):
    """A worker killed between finishing a chunk and refilling the window: the chunk is
    counted, its slot is not freed, nothing more is sent; the next sweep re-counts what is out
    and refills."""
    from evalq.orchestrator.watch import Timing, sweep

    r = redis.Redis.from_url(private_redis)
    only = start(r, private_redis, tmp_path, "only", job(10))
    for _ in range(window):  # finished, but the refill never happened
        args = chunk_args(r.rpop("cpu"))
        r.sadd(keys.chunks_done(only, "metrics"), f"{args[1]}:{args[2]}")
    assert r.llen("cpu") == 0 and int(r.get(keys.sched("cpu", "out"))) == window
    sweep(r, private_redis, Timing(callback_grace=10, resume_after=15))
    assert on_list(r) == [only] * window


def test_jobs_sharing_a_cluster_end_with_the_values_they_have_alone(private_redis, tmp_path, monkeypatch):
    """Real workers: a big low job, a small high one and a normal one at once, then the small
    one alone; every job's results equal those of the same job run alone."""
    monkeypatch.delenv("EVALQ_WINDOW", raising=False)
    r = redis.Redis.from_url(private_redis)
    logs = tmp_path / "logs"
    logs.mkdir()
    worker = start_worker(private_redis, "evalq.jobs,cpu", logs, concurrency=2, name="shared")
    try:
        wait_for_worker(private_redis, "shared")
        ids = {name: start(r, private_redis, tmp_path, name, job(n, priority=p, seconds=0.01))
               for name, n, p in (("big", 60, "low"), ("small", 8, "high"), ("mid", 20, "normal"))}
        alone = start(r, private_redis, tmp_path, "alone", job(8, priority="high", seconds=0.01))
        for job_id in [*ids.values(), alone]:
            wait_for(lambda: r.get(keys.status(job_id)) == b"done", 90, f"job {job_id}")
    finally:
        stop_worker(worker)
    def values(name: str) -> dict:
        return {k: {f: v for f, v in m.items() if f not in ("elapsed_time", "compute_time", "regressions")}
                for k, m in read_results(tmp_path / name).items()}

    assert values("small") == values("alone")
    for name, n in (("big", 60), ("mid", 20)):
        assert values(name)["slow_len"]["n"] == n and values(name)["slow_len"].get("n_missing") is None
    assert not r.smembers(keys.sched("cpu", "jobs"))  # nobody left in line


def test_autoscaling_reads_the_backlog_not_the_list(private_redis, tmp_path, window):
    """The jobs role serves each queue's backlog (chunks planned and not finished) over HTTP,
    which KEDA's metrics-api triggers read (deploy/k8s/base/scaling.yaml)."""
    import urllib.request

    from evalq.cli.embedded import free_port

    r = redis.Redis.from_url(private_redis)
    big = start(r, private_redis, tmp_path, "big", job(120))
    port = free_port()
    logs = tmp_path / "logs"
    logs.mkdir()
    jobs = start_worker(private_redis, "evalq.jobs", logs, concurrency=1, name="jobsrole",
                        env={"EVALQ_BACKLOG_PORT": str(port), "EVALQ_WINDOW": str(window)})
    try:
        wait_for_worker(private_redis, "jobsrole")

        def get(path: str) -> dict:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
                return json.loads(reply.read())

        assert r.llen("cpu") == window  # the list shows a window ...
        assert get("/backlog/cpu") == {"queue": "cpu", "backlog": 120}  # ... the backlog shows the work
        assert get("/backlog") == {"queues": {"cpu": 120}}
        for _ in range(20):
            finish_one(r, private_redis)
        assert get("/backlog/cpu")["backlog"] == 100 and r.llen(keys.pending(big, "cpu")) == 100 - window
    finally:
        stop_worker(jobs)
