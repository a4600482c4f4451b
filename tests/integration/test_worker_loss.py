"""A worker SIGKILLed mid-job: every item still appears exactly once."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid

import psutil
import pytest
import redis

from evalq.cli.embedded import EmbeddedRedis
from evalq.cli.run import run_job
from evalq.shared.cluster import keys
from evalq.shared.job.schema import parse_job
from tests.conftest import read_log, read_results, start_worker, stop_worker, wait_for_worker

pytestmark = pytest.mark.integration


@pytest.fixture
def private_redis(tmp_path):
    server = EmbeddedRedis(tmp_path)
    server.start()
    yield server.url
    server.stop()


def _run_in_thread(job, out, url, chunk_size=None):
    import threading

    box = {}

    def target():
        try:
            box["summary"] = run_job(job, out, broker=url, chunk_size=chunk_size, progress=False, stall_timeout=120)
        except BaseException as exc:  # surfaced by the test
            box["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, box


def _wait_for_items(url: str, minimum: int, timeout: float = 60) -> None:
    r = redis.Redis.from_url(url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = sum(r.hlen(k) for k in r.scan_iter(match=f"{keys.PREFIX}:*:res:*"))
        if done >= minimum:
            return
        time.sleep(0.05)
    raise TimeoutError("job made no progress")


@pytest.mark.parametrize("victim,together", [("whole worker", False), ("pool child", False),
                                              ("whole worker", True), ("pool child", True)])
def test_sigkill_mid_job_loses_and_duplicates_nothing(private_redis, tmp_path, victim, together):
    """``together``: both entries in chunks of 4 items, scored together (one chunk, both entries):
    a kill lands after one entry of a chunk was recorded and before the other was."""
    env = {"EVALQ_VISIBILITY_TIMEOUT": "3"}  # redeliver a dead worker's messages quickly
    logs = tmp_path / "logs"
    logs.mkdir()
    names = [f"a{uuid.uuid4().hex[:4]}", f"b{uuid.uuid4().hex[:4]}"]
    workers = [start_worker(private_redis, "cpu", logs, concurrency=2, env=env, name=n) for n in names]
    try:
        for n in names:
            wait_for_worker(private_redis, n)
        instances = [{"id": f"x{i}", "actual-output": "y" * (i % 7), "expected-output": ["y"]}
                     for i in range(120)]
        job = parse_job({"instances": instances, "metrics": [
            {"id": "slow_len", "parameters": {"seconds": 0.03}}, {"id": "exact_match"}]})
        thread, box = _run_in_thread(job, tmp_path / "out", private_redis, chunk_size=4 if together else None)
        _wait_for_items(private_redis, 20)
        r = redis.Redis.from_url(private_redis)
        spec = json.loads(r.get(next(r.scan_iter(match=f"{keys.PREFIX}:*:spec"))))
        assert (spec["metrics"]["slow_len@0"].get("companions") == ["exact_match@1"]) is together
        main = psutil.Process(workers[0].pid)
        if victim == "whole worker":
            os.killpg(workers[0].pid, signal.SIGKILL)
        else:
            busy = [c for c in main.children() if c.cpu_percent(interval=None) is not None]
            assert busy, "prefork worker has no pool children"
            for child in busy:
                child.send_signal(signal.SIGKILL)
        thread.join(150)
        assert not thread.is_alive(), "job did not finish after the worker was killed"
        assert "error" not in box, box.get("error")
    finally:
        for w in workers:
            stop_worker(w, signal.SIGKILL)

    log = read_log(tmp_path / "out")
    pairs = [(line["instance_id"], line["metric"]) for line in log]
    assert len(pairs) == len(set(pairs)) == 240
    assert all("error" not in line for line in log)
    slow = {line["instance_id"]: line["result"] for line in log if line["metric"] == "slow_len"}
    assert slow == {inst["id"]: len(inst["actual-output"]) for inst in instances}
    results = read_results(tmp_path / "out")
    assert results["slow_len"]["n"] == 120 and results["exact_match"]["n"] == 120


def test_a_stage_left_one_chunk_short_is_finalized_anyway(redis_url, cpu_worker, tmp_path, monkeypatch):
    # Should a stage's counter ever stay short (a callback message lost with
    # a broker restart, say), the waiting orchestrator sees every item
    # recorded and sends the callback itself. Here the stage is told it has one
    # chunk more than it does, so the last chunk cannot send the callback.
    from evalq.cli import wait as waiting
    from evalq.orchestrator import submit
    from evalq.orchestrator.app import client_app

    monkeypatch.setenv("EVALQ_CALLBACK_GRACE", "1")
    instances = [{"id": f"x{i}", "actual-output": "y" * (i % 3), "expected-output": ["y"]} for i in range(9)]
    job = parse_job({"instances": instances, "metrics": [{"id": "exact_match"}]})
    r = redis.Redis.from_url(redis_url)
    spec = submit.job_spec(job, chunk_size=4, out=str(tmp_path / "out"))
    job_id = submit.store_job(r, job, spec)
    r.hset(keys.plan(job_id), "metrics:total", 4)  # 3 chunks of at most 4 items, and a phantom
    app = client_app(redis_url)
    for chunk in submit.plan(job, chunk_size=4):
        app.send_task("evalq.score_chunk", args=(job_id, chunk.metric_key, chunk.start, chunk.stop),
                      queue=chunk.queue)
    assert waiting.wait(r, redis_url, job_id, on_progress=lambda n: None, check=lambda: None,
                       stall_timeout=60) == "done"
    assert (tmp_path / "out" / "results.json").exists()
    summary, _ = submit.summaries(r, job_id)
    assert summary[0]["n"] == 9 and summary[0]["score"] == pytest.approx(3 / 9)


def test_the_jobs_worker_killed_mid_submit_makes_exactly_one_job(private_redis, tmp_path):
    """The evalq.jobs worker is SIGKILLed while it stores a request's job: the
    request is redelivered and makes one job, complete, answered once."""
    import json

    from celery import Celery

    env = {"EVALQ_VISIBILITY_TIMEOUT": "3", "EVALQ_REQUEST_ROOTS": str(tmp_path)}
    logs = tmp_path / "logs"
    logs.mkdir()
    n = 30_000
    path = tmp_path / "job.json"
    path.write_text(json.dumps({
        "instances": [{"id": f"x{i}", "actual-output": "y" * (i % 3), "expected-output": ["y"]} for i in range(n)],
        "metrics": [{"id": "exact_match"}]}))
    r = redis.Redis.from_url(private_redis)
    first = start_worker(private_redis, "evalq.jobs", logs, concurrency=1, env=env, name="jobs1")
    workers = [first]
    try:
        wait_for_worker(private_redis, "jobs1")
        sender = Celery(broker=private_redis)
        sender.conf.update(task_serializer="json", accept_content=["json"])
        request_id = f"req-{uuid.uuid4().hex}"
        sender.send_task("evalq.submit_job", queue="evalq.jobs", kwargs={
            "job_uri": str(path), "out": str(tmp_path / "out"), "request_id": request_id, "reply_to": "done"})
        deadline = time.monotonic() + 60
        while not (r.get(keys.request(request_id)) and r.llen(keys.instances(r.get(keys.request(request_id))
                                                                             .decode()))):
            assert time.monotonic() < deadline, "the jobs worker never began storing the job"
            time.sleep(0.001)
        os.killpg(first.pid, signal.SIGKILL)  # mid-store: instances half pushed, nothing sent
        first.wait(10)
        job_id = r.get(keys.request(request_id)).decode()
        assert not r.hget(keys.plan(job_id), "metrics:sent")
        assert r.llen("cpu") == 0
        workers += [start_worker(private_redis, "evalq.jobs", logs, concurrency=1, env=env, name="jobs2"),
                    start_worker(private_redis, "cpu", logs, concurrency=2, env=env, name="cpu2")]
        deadline = time.monotonic() + 150
        while (got := r.blpop(["done"], timeout=1)) is None:
            assert time.monotonic() < deadline, "no reply after the redelivery"
        doc = json.loads(got[1])
        assert doc["status"] == "done" and doc["job_id"] == job_id
        time.sleep(1.0)
        assert r.llen("done") == 0  # one reply
    finally:
        for w in workers:
            stop_worker(w, signal.SIGKILL)
    assert r.zcard(keys.JOBS) == 1  # one job
    assert r.llen(keys.instances(job_id)) == n  # stored once, not twice
    log = read_log(tmp_path / "out")
    assert len(log) == len({line["instance_id"] for line in log}) == n
    summary = read_results(tmp_path / "out")["exact_match"]
    assert summary["n"] == n and summary["score"] == pytest.approx(sum(i % 3 == 1 for i in range(n)) / n)
