"""Operating a running judge job: cancel stops the judge calls, resume re-sends
what the broker lost. Judge calls are counted by judge-sim over real HTTP; real
Redis, real worker processes."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid

import pytest
import redis

from evalq.shared.cluster import keys
from evalq.sim import JudgeSim, Region
from tests.conftest import evalq, read_log, start_worker, stop_worker, wait_for_worker

pytestmark = pytest.mark.integration

SECRET = "sk-evalq-test-" + uuid.uuid4().hex
KEY_ENV = "TEST_RESUME_API_KEY"
CHUNK = 4  # coherence's chunk size: items per judge task


@pytest.fixture(scope="module")
def sim():
    with JudgeSim([Region("lab")], latency=0.05, api_key=SECRET, seed=11) as s:
        yield s


@pytest.fixture
def logs(tmp_path_factory):
    return tmp_path_factory.mktemp("resume-workers")


def judge_worker(redis_url: str, logs, concurrency: int = 2):
    name = f"judge{uuid.uuid4().hex[:6]}"
    proc = start_worker(redis_url, "judge.lab", logs, concurrency=concurrency, name=name, env={KEY_ENV: SECRET})
    wait_for_worker(redis_url, name)
    return proc


def judge_job(sim, tmp_path, n: int, timeout: float = 5) -> tuple[str, dict[str, int]]:
    tag = uuid.uuid4().hex  # fresh texts: nothing answered from an earlier test's cache
    scores = {f"q{i}": 1 + i % 5 for i in range(n)}
    job = {"instances": [{"id": f"q{i}", "input": f"Question {i}?",
                          "actual-output": f"Answer {i} {tag} [[sim:score={scores[f'q{i}']}]]"} for i in range(n)],
           "judges": {"sim": {"provider": "openai", "model": "judge-sim", "api_key_env": KEY_ENV, "max_tokens": 100,
                              "max_retries": 0, "timeout": timeout,
                              "deployments": [{"region": "lab", "base_url": sim.base_url("lab"),
                                               "tpm": 10_000_000, "rpm": 100_000}]}},
           "judging": {"cache": False},
           "metrics": [{"id": "coherence", "parameters": {"judge": "sim"}}]}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    return str(path), scores


def submit(path: str, out, redis_url: str) -> str:
    proc = evalq("submit", path, "--out", str(out), "--broker", redis_url, env={KEY_ENV: SECRET})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def wait_for(predicate, timeout: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_cancel_stops_judge_calls_beyond_those_in_flight(redis_url, sim, logs, tmp_path):
    r = redis.Redis.from_url(redis_url)
    n, concurrency = 120, 2
    path, _ = judge_job(sim, tmp_path, n, timeout=600)  # a held call waits for the test, not the clock
    sim.reset_stats()
    # 12 calls answered, then every later one held unanswered: the job cannot end (nor its running
    # chunks) before the cancel, however slow the machine or the CLI's start
    sim.hold("lab", after=12)
    worker = judge_worker(redis_url, logs, concurrency)
    try:
        job_id = submit(path, tmp_path / "out", redis_url)
        # a few items judged (the 12 let through), and the running chunks' next calls held
        wait_for(lambda: sim.stats("lab")["ok"] == 12 and sim.stats("lab")["held"] >= 1, 300,
                 what="12 judged items, then held calls")
        proc = evalq("cancel", job_id, "--broker", redis_url)
        assert proc.returncode == 0 and "cancelled" in proc.stdout, proc.stderr
        at_cancel = sim.stats("lab")["requests"]
        sim.release("lab")
        # the workers drain the job's remaining messages without running them
        wait_for(lambda: r.llen("judge.lab") == 0, 300, what="the queue to drain")
        proc = evalq("wait", job_id, "--broker", redis_url)
        assert proc.returncode == 1 and "cancelled" in proc.stderr
        # the final callback does not wait for the chunks that were running: the worker's warm
        # shutdown does, so after it nothing of the job calls any more
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(300)
        calls = sim.stats("lab")["requests"]
        # only the chunks running when it was cancelled may still call the judge
        assert calls - at_cancel <= concurrency * CHUNK
        assert calls < n
        recorded = r.hlen(keys.results(job_id, "coherence@0"))
        assert recorded == calls  # every call paid for is recorded, nothing else ran
        run = json.loads((tmp_path / "out" / "run.json").read_text())
        assert run["status"] == "cancelled"
        log = read_log(tmp_path / "out")
        assert len(log) == n
        assert sum("skipped" in line for line in log) >= n - recorded
    finally:
        sim.release("lab")
        stop_worker(worker)


def test_resume_after_the_broker_lost_the_queued_tasks(redis_url, sim, logs, tmp_path):
    r = redis.Redis.from_url(redis_url)
    n = 60
    path, scores = judge_job(sim, tmp_path, n)
    sim.reset_stats()
    assert r.llen("judge.lab") == 0
    from evalq.orchestrator.dispatch import window

    # the queue's window is what its workers announced: an earlier test's worker's slots may still count
    # while the job is sent and lapse before it is read back (no worker runs now: it only shrinks)
    before = window(r, "judge.lab")
    job_id = submit(path, tmp_path / "out", redis_url)  # no judge worker yet: the chunks wait in line

    # the chunks are in line (sent now, or held back for the queue's window) once submit returns; read
    # until they add up rather than once: a loaded machine's dispatcher may still hold its lock
    wait_for(lambda: r.llen("judge.lab") + r.llen(keys.pending(job_id, "judge.lab")) == n // CHUNK
             and r.llen("judge.lab") > 0, what="the job's chunks in line")
    queued = r.llen("judge.lab")
    assert 0 < queued <= before and queued + r.llen(keys.pending(job_id, "judge.lab")) == n // CHUNK
    worker = judge_worker(redis_url, logs)
    wait_for(lambda: r.hlen(keys.results(job_id, "coherence@0")) >= 12, what="a few judged items")
    stop_worker(worker)  # warm shutdown: the running chunks finish, the rest go back to the queue
    recorded = r.hlen(keys.results(job_id, "coherence@0"))
    finished = r.scard(keys.chunks_done(job_id, "metrics"))
    assert 0 < recorded < n and recorded == finished * CHUNK
    assert sim.stats("lab")["requests"] == recorded
    # the broker loses its queued tasks (a restart without persistence): only the
    # queue lists go, the job's records stay
    r.delete("judge.lab")
    proc = evalq("wait", job_id, "--broker", redis_url, "--stall-timeout", "2")
    assert proc.returncode == 1 and "no progress" in proc.stderr

    proc = evalq("resume", job_id, "--broker", redis_url)
    assert proc.returncode == 0, proc.stderr
    assert f"re-sent {n // CHUNK - finished} unfinished chunk(s)" in proc.stdout
    assert r.llen("judge.lab") + r.llen(keys.pending(job_id, "judge.lab")) == n // CHUNK - finished
    worker = judge_worker(redis_url, logs)
    try:
        proc = evalq("wait", job_id, "--broker", redis_url)
        assert proc.returncode == 0, proc.stderr
    finally:
        stop_worker(worker)
    # every item judged exactly once: nothing recomputed, no call paid twice
    assert sim.stats("lab")["requests"] == n
    log = read_log(tmp_path / "out")
    assert sorted(line["instance_id"] for line in log) == sorted(scores)
    assert all(line["result"]["score"] == scores[line["instance_id"]] for line in log)
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results[0]["score"]["mean"] == pytest.approx(sum(scores.values()) / n)
    assert results[0]["judge"]["calls"] == n
    status = json.loads(evalq("status", job_id, "--json", "--broker", redis_url).stdout)
    entry = status["entries"][0]
    assert entry["done"] == entry["total"] == n and status["status"] == "done"
    assert entry["judge"]["calls"] == entry["judge"]["regions"]["lab"]["calls"] == n
    assert entry["judge"]["regions"]["lab"]["prompt_tokens"] == sim.stats("lab")["prompt_tokens"]
    assert status["queues"] == {"judge.lab": 0}
    assert status["stages"]["metrics"] == {"chunks": n // CHUNK, "sent": n // CHUNK, "finished": n // CHUNK}
    # a finished job has nothing to resume
    proc = evalq("resume", job_id, "--broker", redis_url)
    assert proc.returncode == 0 and "done; nothing to resume" in proc.stdout


def test_resume_sends_a_lost_final_callback_again(redis_url, cpu_worker, tmp_path):
    """All chunks finished but the callback message was lost: resume sends it again."""
    r = redis.Redis.from_url(redis_url)
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"instances": [{"id": f"i{i}", "actual-output": "a", "expected-output": ["a"]}
                                              for i in range(5)], "metrics": [{"id": "exact_match"}]}))
    job_id = submit(str(path), tmp_path / "out", redis_url)
    wait_for(lambda: r.get(keys.status(job_id)) == b"done", what="the job to end")
    # make it look as if the callback never ran
    r.set(keys.status(job_id), "running")
    os.remove(tmp_path / "out" / "results.json")
    proc = evalq("resume", job_id, "--broker", redis_url)
    assert proc.returncode == 0 and "sent its callback (evalq.finalize) again" in proc.stdout, proc.stdout
    wait_for(lambda: r.get(keys.status(job_id)) == b"done", what="the callback")
    assert json.loads((tmp_path / "out" / "results.json").read_text())[0]["score"] == 1.0
