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

from evalq.shared.cluster import keys
from tests.conftest import PLUGINS, evalq, read_log, read_results, start_worker, stop_worker, wait_for_worker

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
    assert "every item of the metrics stage is recorded but its callback has neither run nor started" in \
        workers[0].log_path.read_text()
    status = json.loads(evalq("status", job_id, "--json", "--broker", private_redis).stdout)
    assert list(status["recovery"]["callbacks_resent"]) == ["metrics"] and "resumes" not in status["recovery"]


def test_two_lookers_take_a_step_once(private_redis, tmp_path, monkeypatch):
    """The waiting client and a sweeper (or two sweepers) look at the same job at
    the same moment: the chunks are re-sent once, not twice."""
    monkeypatch.setenv("EVALQ_WINDOW", FAST["EVALQ_WINDOW"])
    from evalq.orchestrator import submit as submitting
    from evalq.orchestrator.watch import Timing, items_done, look_after, run_keys
    from evalq.shared.job.schema import parse_job

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
    r.incr(keys.recorded_total(job_id, run_keys(spec)[0]))  # a chunk's item recorded
    counts = items_done(r, job_id, run_keys(spec))
    assert look_after(r, private_redis, job_id, spec, "running", counts, timing, now=t0 + 61) == []
    again = look_after(r, private_redis, job_id, spec, "running", counts, timing, now=t0 + 64)
    assert len(again) == 1 and "re-sent" in again[0]
    assert r.ttl(keys.watch(job_id)) > 0  # the record goes with the job
    from evalq.orchestrator.watch import recovery

    assert recovery(r, job_id)["resumes"] == 2


def slow_callbacks(seconds: float, key: str) -> dict:
    """A worker whose final callback writes its outputs ``seconds`` late (tests/plugins/slow_callback)."""
    return {"EVALQ_PLUGINS": PLUGINS + ",tests.plugins.slow_callback", "SLOW_CALLBACK_SECONDS": str(seconds),
            "SLOW_CALLBACK_KEY": key, "EVALQ_CALLBACK_LEASE": "2"}


def writes(r: redis.Redis, key: str) -> list[tuple[str, str, float]]:
    return [(kind, pid, float(t)) for kind, pid, t in (e.decode().split(":") for e in r.lrange(key, 0, -1))]


def test_a_callback_slower_than_the_grace_is_not_sent_again(private_redis, tmp_path):
    """Before: a big job's final callback took longer than EVALQ_CALLBACK_GRACE, and the waiting
    client sent it again while it was still writing: two copies wrote the outputs at once. A
    running callback holds a lease it renews; neither the client nor the sweeper sends another."""
    r = redis.Redis.from_url(private_redis)
    logs = tmp_path / "logs"
    logs.mkdir()
    slow = slow_callbacks(5, "test:writes")
    workers = [start_worker(private_redis, "evalq.jobs", logs, concurrency=1, env={**FAST, **slow}, name="jobs"),
               start_worker(private_redis, "cpu", logs, name="cpu", env={**slow, "EVALQ_SWEEP_INTERVAL": "0"})]
    try:
        wait_for_worker(private_redis, "jobs")
        wait_for_worker(private_redis, "cpu")
        path = tmp_path / "job.json"
        path.write_text(json.dumps({"instances": [{"id": f"x{i}", "actual-output": "y" * (i % 3),
                                                   "expected-output": ["y"]} for i in range(N)],
                                    "metrics": [{"id": "exact_match"}]}))
        # the waiting client looks after its job too, with the same 1 s grace
        proc = evalq("run", str(path), "--out", str(tmp_path / "out"), "--broker", private_redis,
                     "--chunk-size", str(CHUNK), "-q", env={"EVALQ_CALLBACK_GRACE": "1"}, timeout=120)
    finally:
        for w in workers:
            stop_worker(w)
    assert proc.returncode == 0, proc.stderr
    check_outputs(tmp_path / "out")
    assert [kind for kind, _, _ in writes(r, "test:writes")] == ["start", "end"]  # one copy wrote, once
    said = proc.stderr + "".join(w.log_path.read_text() for w in workers)
    assert "sent it again" not in said
    assert not [f for w in r.scan_iter("evalq:*:watch") for f in r.hkeys(w) if f.startswith(b"nudged:")]


def test_a_callback_that_died_is_sent_again_once_its_lease_lapses(private_redis, tmp_path):
    """The worker running the final callback is killed midway: the callback's lease lapses (2 s)
    and the sweeper of the other worker sends it again; the outputs are written whole, once."""
    import signal

    r = redis.Redis.from_url(private_redis)
    logs = tmp_path / "logs"
    logs.mkdir()
    # long enough that the kill lands mid-write, however slowly `evalq submit` hands back under load
    slow = slow_callbacks(8, "test:writes")
    workers = {name: start_worker(private_redis, "evalq.jobs,cpu", logs, concurrency=1, name=name,
                                  env={**FAST, **slow}) for name in ("one", "two")}
    try:
        for name in workers:
            wait_for_worker(private_redis, name)
        job_id = submit(private_redis, tmp_path)
        lease = keys.callback_lease(job_id, "metrics")
        wait_for(lambda: [k for k, _, _ in writes(r, "test:writes")] == ["start"], 60, "the outputs' writing")
        holder = r.get(lease).decode().split("@")[0]
        stop_worker(workers[holder], signal.SIGKILL)  # the whole worker, mid-write
        wait_for(lambda: r.get(keys.status(job_id)) == b"done", 60, "the callback to be sent again and end")
    finally:
        for w in workers.values():
            stop_worker(w)
    check_outputs(tmp_path / "out")
    seen = writes(r, "test:writes")
    assert [kind for kind, _, _ in seen] == ["start", "start", "end"], seen
    assert seen[1][2] - seen[0][2] >= 2  # not before the killed copy's lease lapsed
    survivor = next(w for name, w in workers.items() if name != holder)
    assert "its callback has neither run nor started" in survivor.log_path.read_text()
