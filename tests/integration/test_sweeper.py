"""The cluster looks after its own jobs: a job whose submitter went away (or never
waited) still recovers lost messages, through the sweeper of the evalq.jobs
worker. Real Redis (a private one per test, so no other test's jobs are swept),
real worker processes, nobody waiting on the job."""

from __future__ import annotations

import json
import os
import time

import pytest
import redis

from evalq.shared import keys
from tests.conftest import evalq, read_log, read_results, start_worker, stop_worker, wait_for_worker

pytestmark = pytest.mark.integration

FAST = {"EVALQ_SWEEP_INTERVAL": "0.5", "EVALQ_RESUME_AFTER": "2", "EVALQ_CALLBACK_GRACE": "1",
        # a window that holds every chunk: the broker's list is what a lost-message test loses
        "EVALQ_WINDOW": "1000"}
N, CHUNK = 40, 4


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def submit(redis_url: str, tmp_path) -> str:
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"instances": [{"id": f"x{i}", "actual-output": "y" * (i % 3),
                                               "expected-output": ["y"]} for i in range(N)],
                                "metrics": [{"id": "exact_match"}]}))
    proc = evalq("submit", str(path), "--out", str(tmp_path / "out"), "--broker", redis_url,
                 "--chunk-size", str(CHUNK))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def check_outputs(out) -> None:
    log = read_log(out)
    assert sorted(line["instance_id"] for line in log) == sorted(f"x{i}" for i in range(N))  # each once
    summary = read_results(out)["exact_match"]
    assert summary["n"] == N and summary["score"] == pytest.approx(sum(i % 3 == 1 for i in range(N)) / N)


def test_a_job_nobody_waits_for_gets_its_lost_chunks_again(private_redis, tmp_path, monkeypatch):
    monkeypatch.setenv("EVALQ_WINDOW", FAST["EVALQ_WINDOW"])
    r = redis.Redis.from_url(private_redis)
    logs = tmp_path / "logs"
    logs.mkdir()
    jobs = start_worker(private_redis, "evalq.jobs", logs, concurrency=1, env=FAST, name="jobs")
    workers = [jobs]
    try:
        wait_for_worker(private_redis, "jobs")
        job_id = submit(private_redis, tmp_path)  # returns at once; nobody waits on the job
        assert r.llen("cpu") == N // CHUNK  # no cpu worker yet: the chunks wait in the queue
        r.delete("cpu")  # ... and the broker loses them (a restart without persistence)
        workers.append(start_worker(private_redis, "cpu", logs, name="cpu"))
        wait_for(lambda: r.get(keys.status(job_id)) == b"done", 60, "the sweeper to resume the job")
    finally:
        for w in workers:
            stop_worker(w)
    check_outputs(tmp_path / "out")
    swept = jobs.log_path.read_text()
    assert f"sweeper: job {job_id}: no progress" in swept and f"re-sent {N // CHUNK} unfinished chunk(s)" in swept
    assert r.scard(keys.chunks_done(job_id, "metrics")) == N // CHUNK
    status = evalq("status", job_id, "--json", "--broker", private_redis)
    assert json.loads(status.stdout)["recovery"]["resumes"] == 1
    text = evalq("status", job_id, "--broker", private_redis).stdout
    assert "recovery: unfinished chunks re-sent 1 time(s)" in text


def test_a_stage_whose_callback_was_lost_is_finalized_by_the_sweeper(private_redis, tmp_path):
    r = redis.Redis.from_url(private_redis)
    logs = tmp_path / "logs"
    logs.mkdir()
    workers = [start_worker(private_redis, "evalq.jobs", logs, concurrency=1, env=FAST, name="jobs"),
               start_worker(private_redis, "cpu", logs, name="cpu", env={"EVALQ_SWEEP_INTERVAL": "0"})]
    try:
        wait_for_worker(private_redis, "jobs")
        job_id = submit(private_redis, tmp_path)
        wait_for(lambda: r.get(keys.status(job_id)) == b"done", 60, "the job to end")
        # as if the final callback had been lost: every chunk finished, no outputs, still running
        r.set(keys.status(job_id), "running")
        os.remove(tmp_path / "out" / "results.json")
        wait_for(lambda: r.get(keys.status(job_id)) == b"done", 30, "the sweeper to send the callback")
    finally:
        for w in workers:
            stop_worker(w)
    check_outputs(tmp_path / "out")
    assert "every item of the metrics stage is recorded but its callback has not run" in \
        workers[0].log_path.read_text()
    status = json.loads(evalq("status", job_id, "--json", "--broker", private_redis).stdout)
    assert list(status["recovery"]["callbacks_resent"]) == ["metrics"] and "resumes" not in status["recovery"]


def test_two_lookers_take_a_step_once(private_redis, tmp_path, monkeypatch):
    """The waiting client and a sweeper (or two sweepers) look at the same job at
    the same moment: the chunks are re-sent once, not twice."""
    monkeypatch.setenv("EVALQ_WINDOW", FAST["EVALQ_WINDOW"])
    from evalq.orchestrator import submit as submitting
    from evalq.orchestrator.watch import Timing, items_done, look_after, run_keys
    from evalq.shared.job import parse_job

    r = redis.Redis.from_url(private_redis)
    job = parse_job({"instances": [{"id": f"x{i}", "actual-output": "y", "expected-output": ["y"]}
                                   for i in range(N)], "metrics": [{"id": "exact_match"}]})
    job_id = submitting.submit(r, private_redis, job, chunk_size=CHUNK, out=str(tmp_path / "out"))
    spec = json.loads(r.get(keys.spec(job_id)))
    r.delete("cpu")  # lost
    timing = Timing(callback_grace=1, resume_after=2)
    counts = items_done(r, job_id, run_keys(spec))
    t0 = 1_000_000.0
    assert look_after(r, private_redis, job_id, spec, "running", counts, timing, now=t0) == []  # first sight
    assert look_after(r, private_redis, job_id, spec, "running", counts, timing, now=t0 + 1) == []  # too soon
    first = look_after(r, private_redis, job_id, spec, "running", counts, timing, now=t0 + 3)
    assert len(first) == 1 and f"re-sent {N // CHUNK} unfinished chunk(s)" in first[0]
    r.delete("cpu")  # lost once more: the queue holds nothing, yet the step is not taken twice
    assert look_after(r, private_redis, job_id, spec, "running", counts, timing, now=t0 + 3) == []
    assert look_after(r, private_redis, job_id, spec, "running", counts, timing, now=t0 + 60) == []
    # once items finish again, a later stall may be resumed again
    r.hset(keys.results(job_id, run_keys(spec)[0]), "0", "{}")
    counts = items_done(r, job_id, run_keys(spec))
    assert look_after(r, private_redis, job_id, spec, "running", counts, timing, now=t0 + 61) == []
    again = look_after(r, private_redis, job_id, spec, "running", counts, timing, now=t0 + 64)
    assert len(again) == 1 and "re-sent" in again[0]
    assert r.ttl(keys.watch(job_id)) > 0  # the record goes with the job
    from evalq.orchestrator.watch import recovery

    assert recovery(r, job_id)["resumes"] == 2
