"""The cluster owns a job: a plain Celery message in, files and one reply out,
with no evalq process attached. Real Redis, real worker processes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid

import pytest
import redis
from celery import Celery

from evalq.shared.cluster import keys

from evalq.shared.scores import stats
from tests.conftest import ROOT, evalq, start_worker, stop_worker, wait_for_worker

pytestmark = pytest.mark.integration

INSTANCES = [{"id": f"i{n}", "input": "q", "actual-output": "a b c" if n % 2 else "x y",
              "expected-output": ["a b c"]} for n in range(10)]


@pytest.fixture(scope="module")
def service(redis_url, tmp_path_factory):
    """A worker on evalq.jobs (the orchestrator role) and cpu, as a cluster runs them."""
    name = f"jobs{uuid.uuid4().hex[:6]}"
    # requests may name local files under the test's temporary directories only
    proc = start_worker(redis_url, "evalq.jobs,cpu", tmp_path_factory.mktemp("jobs-workers"), name=name,
                        env={"EVALQ_REQUEST_ROOTS": str(tmp_path_factory.getbasetemp())})
    wait_for_worker(redis_url, name)
    yield proc
    stop_worker(proc)


def pipeline_app(url: str) -> Celery:
    """What a pipeline uses: plain Celery, JSON, nothing of evalq."""
    app = Celery(broker=url)
    app.conf.update(task_serializer="json", accept_content=["json"])
    return app


def send(url: str, **kwargs) -> None:
    pipeline_app(url).send_task("evalq.submit_job", kwargs=kwargs, queue="evalq.jobs")


def await_reply(r: redis.Redis, reply_to: str, timeout: float = 90) -> dict:
    # short blocking pops: redis-py's client reads with a 5 s socket timeout by default
    deadline = time.monotonic() + timeout
    while (got := r.blpop([reply_to], timeout=2)) is None:
        assert time.monotonic() < deadline, f"no reply on {reply_to} within {timeout} s"
    return json.loads(got[1])


def slow_job_file(tmp_path, prefix: str, n: int, answer: str, seconds: float, **parameters):
    """A job file of ``n`` instances scored by the test plugin's ``slow_len`` (``gate``, ``started``:
    files that hold its items and show they started)."""
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"instances": [{"id": f"{prefix}{i}", "actual-output": answer} for i in range(n)],
                                "metrics": [{"id": "slow_len", "parameters": {"seconds": seconds, **parameters}}]}))
    return path


def test_message_in_files_and_one_reply_out(redis_url, service, tmp_path):
    r = redis.Redis.from_url(redis_url)
    reply_to = f"replies:{uuid.uuid4().hex}"
    job = {"instances": INSTANCES, "metrics": [{"id": "exact_match"}, {"id": "f1_score"},
                                               {"id": "exact_match", "enable": False}]}
    send(redis_url, job=job, out=str(tmp_path / "out"), request_id=f"req-{uuid.uuid4().hex}", reply_to=reply_to)
    doc = await_reply(r, reply_to)
    assert set(doc) == {"request_id", "job_id", "status", "out", "errors", "results"}
    assert doc["status"] == "done" and doc["errors"] == [] and doc["out"] == str(tmp_path / "out")
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["results"] == results
    assert [m["metric"] for m in results] == ["exact_match", "f1_score"]
    assert results[0]["score"] == pytest.approx(0.5) and results[0]["n"] == 10
    assert results[0]["ci95"] == pytest.approx(stats.wilson(5, 10))  # 0/1 values: Wilson, never past [0, 1]
    log = [json.loads(line) for line in (tmp_path / "out" / "log.jsonl").read_text().splitlines()]
    assert len(log) == 20
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["job_id"] == doc["job_id"] and run["status"] == "done"
    time.sleep(0.5)
    assert r.llen(reply_to) == 0  # exactly one document


def test_the_same_request_id_starts_one_job(redis_url, service, tmp_path):
    r = redis.Redis.from_url(redis_url)
    request_id = f"req-{uuid.uuid4().hex}"
    first, second = f"replies:{uuid.uuid4().hex}", f"replies:{uuid.uuid4().hex}"
    job = {"instances": INSTANCES, "metrics": [{"id": "slow_len", "parameters": {"seconds": 0.05}}]}
    send(redis_url, job=job, out=str(tmp_path / "a"), request_id=request_id, reply_to=first)
    send(redis_url, job=job, out=str(tmp_path / "b"), request_id=request_id, reply_to=second)
    a, b = await_reply(r, first), await_reply(r, second)
    assert a["job_id"] == b["job_id"] and a["status"] == b["status"] == "done"
    # one of the two started the job and the other nothing: the worker's two processes may take
    # either message first, so either may be the one that binds the request_id
    started = [d for d in ("a", "b") if (tmp_path / d).exists()]
    assert len(started) == 1 and (tmp_path / started[0] / "results.json").exists()
    # and once the job has ended, a third is answered at once, with the same job
    third = f"replies:{uuid.uuid4().hex}"
    send(redis_url, job=job, out=str(tmp_path / "c"), request_id=request_id, reply_to=third)
    assert await_reply(r, third, timeout=30)["job_id"] == a["job_id"]
    assert r.get(keys.request(request_id)).decode() == a["job_id"]


def test_a_request_repeated_on_the_same_list_gets_its_own_reply(redis_url, service, cpu_worker, tmp_path):
    """A pipeline that lost the first reply asks again on the same list: one document
    per request, each when the job ends; a re-run final callback and a redelivered
    message push nothing more."""
    from evalq.shared.core.config import CONTROL_QUEUE

    r = redis.Redis.from_url(redis_url)
    request_id, reply_to = f"req-{uuid.uuid4().hex}", f"replies:{uuid.uuid4().hex}"
    job = {"instances": INSTANCES, "metrics": [{"id": "slow_len", "parameters": {"seconds": 0.05}}]}
    send(redis_url, job=job, out=str(tmp_path / "a"), request_id=request_id, reply_to=reply_to)
    send(redis_url, job=job, out=str(tmp_path / "a"), request_id=request_id, reply_to=reply_to)
    a, b = await_reply(r, reply_to), await_reply(r, reply_to, timeout=30)
    assert a == b and a["status"] == "done" and a["results"]  # both sent when the job ended
    results = tmp_path / "a" / "results.json"
    written = results.stat().st_mtime_ns
    pipeline_app(redis_url).send_task("evalq.finalize", args=(a["job_id"],), queue=CONTROL_QUEUE)
    deadline = time.monotonic() + 90  # behind whatever else the suite's other modules left on the queue
    said = f"job {a['job_id']}: has ended (done); this copy of its metrics callback ends"
    while not any(said in w.log_path.read_text(errors="replace") for w in (service, cpu_worker)):
        # (either worker of the control queue may take it) a late copy writes nothing again
        assert time.monotonic() < deadline, "the re-sent final callback did not run"
        time.sleep(0.1)
    assert results.stat().st_mtime_ns == written
    # a third request after the end is answered at once; the same message delivered again is not
    message_id = uuid.uuid4().hex
    for _ in range(2):
        pipeline_app(redis_url).send_task("evalq.submit_job", queue="evalq.jobs", task_id=message_id,
                                          kwargs={"job": job, "out": str(tmp_path / "c"), "request_id": request_id,
                                                  "reply_to": reply_to})
    assert await_reply(r, reply_to, timeout=30)["job_id"] == a["job_id"]
    # both copies taken and done with (none on the queue, none unacknowledged): then no second answer
    deadline = time.monotonic() + 120
    while r.llen("evalq.jobs") or any(message_id.encode() in v for v in r.hvals("unacked")):
        assert time.monotonic() < deadline, "the copies were never taken"
        time.sleep(0.05)
    assert r.llen(reply_to) == 0


@pytest.mark.parametrize("request_kwargs,fragment", [
    ({"job": {"instances": INSTANCES, "metrics": [{"id": "bleue"}]}, "out": "/tmp/x"},
     "request.job: metrics[0] (bleue): unknown metric 'bleue'; did you mean 'bleu'?"),
    ({"job": {"instances": INSTANCES, "metrics": [{"id": "bleu"}]}},
     "request.out: missing, and the job has no output.uri"),
    ({"job_uri": "/nonexistent/job.json", "out": "/tmp/x"}, "request.job_uri: /nonexistent/job.json is outside"),
    ({"job": {"instances": [], "metrics": []}, "job_uri": "x.json", "out": "/tmp/x"}, "exactly one of 'job'"),
])
def test_an_invalid_request_is_answered_invalid_and_enqueues_nothing(redis_url, service, request_kwargs,
                                                                   fragment):
    r = redis.Redis.from_url(redis_url)
    reply_to = f"replies:{uuid.uuid4().hex}"
    depth = r.llen("cpu")
    send(redis_url, **request_kwargs, reply_to=reply_to)
    doc = await_reply(r, reply_to)
    assert doc["status"] == "invalid" and doc["results"] is None
    assert any(fragment in e for e in doc["errors"]), doc["errors"]
    assert r.get(keys.spec(doc["job_id"])) is None and r.llen("cpu") == depth


@pytest.mark.parametrize("reply_to", ["cpu", "evalq.control", "judge.lab", "evalq:jobs", "evalq:sweeper", "has space"])
def test_a_reply_list_may_not_be_a_queue_or_key_of_the_cluster(redis_url, service, tmp_path, reply_to):
    r = redis.Redis.from_url(redis_url)
    before = r.type(reply_to), r.llen(reply_to) if r.type(reply_to) == b"list" else None
    request_id = f"req-{uuid.uuid4().hex}"
    send(redis_url, job={"instances": INSTANCES, "metrics": [{"id": "exact_match"}]}, out=str(tmp_path / "o"),
         request_id=request_id, reply_to=reply_to)
    deadline = time.monotonic() + 30
    while r.get(keys.request(request_id)) is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    job_id = r.get(keys.request(request_id)).decode()
    deadline = time.monotonic() + 30
    while r.get(keys.status(job_id)) is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert r.get(keys.status(job_id)) == b"invalid"
    assert "request.reply_to" in r.get(keys.error(job_id)).decode()
    # nothing was pushed (the sweeper's lock key comes and goes on its own: only a list would be ours)
    if before[0] == b"list":
        assert r.llen(reply_to) == before[1]
    else:
        assert r.type(reply_to) != b"list"
    assert not (tmp_path / "o").exists()


def test_job_uri_and_the_jobs_output_uri(redis_url, service, tmp_path):
    r = redis.Redis.from_url(redis_url)
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"instances": INSTANCES, "metrics": [{"id": "exact_match"}],
                                "output": {"uri": str(tmp_path / "from-job")}}))
    reply_to = f"replies:{uuid.uuid4().hex}"
    send(redis_url, job_uri=str(path), reply_to=reply_to)
    assert await_reply(r, reply_to)["status"] == "done"
    assert (tmp_path / "from-job" / "results.json").exists()


def test_cancel_drops_pending_tasks_and_writes_partial_outputs(private_redis, tmp_path):
    """A cluster of its own (one worker: its running chunks are the job's only ones), and items that
    wait at a gate until the job is cancelled: the cancel always lands while the job runs."""
    r = redis.Redis.from_url(private_redis)
    gate, started = tmp_path / "gate", tmp_path / "started"
    job_file = slow_job_file(tmp_path, "c", 1000, "abc", 0, gate=str(gate), started=str(started))
    worker = start_worker(private_redis, "evalq.jobs,cpu", tmp_path, name="cancel")
    try:
        wait_for_worker(private_redis, "cancel")
        proc = evalq("submit", str(job_file), "--out", str(tmp_path / "out"), "--broker", private_redis,
                     "--chunk-size", "10")
        assert proc.returncode == 0, proc.stderr
        job_id = proc.stdout.strip()
        deadline = time.monotonic() + 120  # a failure detector: items start in seconds
        while not started.exists():
            assert time.monotonic() < deadline, "no item started"
            time.sleep(0.05)
        proc = evalq("cancel", job_id, "--broker", private_redis)
        assert proc.returncode == 0 and "cancelled" in proc.stdout, proc.stderr
        gate.touch()  # the chunks that were running go on; the others are dropped unrun
        proc = evalq("wait", job_id, "--broker", private_redis)
        assert proc.returncode == 1 and "cancelled" in proc.stderr
        stop_worker(worker)  # a warm shutdown: the running chunks end first; nothing runs after it
        recorded = r.hlen(keys.results(job_id, "slow_len@0"))
        assert 0 < recorded <= 2 * 10  # the chunks its two processes were running, no more
    finally:
        gate.touch()
        stop_worker(worker)
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["status"] == "cancelled"
    log = [json.loads(line) for line in (tmp_path / "out" / "log.jsonl").read_text().splitlines()]
    assert len(log) == 1000
    assert sum("skipped" in line for line in log) >= 1000 - recorded
    status = json.loads(evalq("status", job_id, "--json", "--broker", private_redis).stdout)
    assert status["status"] == "cancelled" and status["items"]["total"] == 1000


def test_the_job_finishes_when_the_cli_that_ran_it_is_killed(redis_url, service, tmp_path):
    r = redis.Redis.from_url(redis_url)
    gate, started = tmp_path / "gate", tmp_path / "started"
    # its items wait at the gate: the CLI is killed while the job runs, however fast the machine
    job_file = slow_job_file(tmp_path, "k", 60, "abcd", 0.01, gate=str(gate), started=str(started))
    out = tmp_path / "out"
    cli = subprocess.Popen([sys.executable, "-m", "evalq.cli", "run", str(job_file), "--out", str(out),
                            "--broker", redis_url, "-q"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120  # a failure detector: an item starts in seconds
        while not started.exists():
            assert cli.poll() is None, cli.communicate()
            assert time.monotonic() < deadline, "no item started"
            time.sleep(0.05)
        job_id = None
        for raw, _ in r.zrevrange(keys.JOBS, 0, -1, withscores=True):
            spec = json.loads(r.get(keys.spec(raw.decode())) or "{}")
            if spec.get("source") == str(job_file):
                job_id = raw.decode()
        assert job_id is not None
        cli.send_signal(signal.SIGKILL)
        cli.wait(60)
        assert r.get(keys.status(job_id)) == b"running"
    finally:
        gate.touch()
    assert not (out / "results.json").exists()
    proc = evalq("wait", job_id, "--broker", redis_url)
    assert proc.returncode == 0, proc.stderr
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [line["result"] for line in log] == [4] * 60
    status = json.loads(evalq("status", "--json", "--broker", redis_url).stdout)
    assert any(row["job_id"] == job_id and row["status"] == "done" for row in status)


@pytest.mark.parametrize("request_kwargs,fragment", [
    ({"job_uri": "/etc/hosts", "out": "OUT"}, "request.job_uri: /etc/hosts is outside the directories"),
    ({"job": {"instances": INSTANCES, "metrics": [{"id": "exact_match"}]}, "out": "/root/evalq-out"},
     "request.out: /root/evalq-out is outside the directories"),
    ({"job": {"dataset": {"uri": "/etc/passwd", "format": "jsonl"}, "metrics": [{"id": "exact_match"}]},
      "out": "OUT"}, "dataset.uri: /etc/passwd is outside the directories"),
    ({"job": {"instances": INSTANCES, "metrics": [{"id": "exact_match"}], "output": {"uri": "/var/evalq"}}},
     "output.uri: /var/evalq is outside the directories"),
])
def test_a_request_may_name_local_files_only_under_the_allowed_roots(redis_url, service, tmp_path,
                                                                      request_kwargs, fragment):
    r = redis.Redis.from_url(redis_url)
    reply_to = f"replies:{uuid.uuid4().hex}"
    kwargs = {k: (str(tmp_path / "out") if v == "OUT" else v) for k, v in request_kwargs.items()}
    send(redis_url, **kwargs, reply_to=reply_to)
    doc = await_reply(r, reply_to)
    assert doc["status"] == "invalid" and any(fragment in e for e in doc["errors"]), doc["errors"]
    assert not any("root:" in e for e in doc["errors"])  # nothing of /etc/passwd was read into a message
    assert not (tmp_path / "out").exists() and not __import__("os").path.exists("/root/evalq-out")


def test_a_squatted_request_id_is_answered_conflict_never_with_the_squatters_results(redis_url, service, tmp_path):
    """Before: a message with the pipeline's predictable request_id and an all-correct job, sent first,
    made the real request answer `done` with the squatter's outputs (score 1.0): a quality gate passed
    on forged numbers. Now a request_id is bound to what its first request asked: the same id with a
    different job is answered `conflict`, with nothing of the other job; the same request again is
    answered as before."""
    r = redis.Redis.from_url(redis_url)
    request_id = f"nightly-{uuid.uuid4().hex}"
    forged = {"instances": [{**i, "actual-output": "a b c"} for i in INSTANCES], "metrics": [{"id": "exact_match"}]}
    real = {"instances": INSTANCES, "metrics": [{"id": "exact_match"}]}
    squatter, victim, again = (f"replies:{uuid.uuid4().hex}" for _ in range(3))
    send(redis_url, job=forged, out=str(tmp_path / "forged"), request_id=request_id, reply_to=squatter)
    assert await_reply(r, squatter)["results"][0]["score"] == 1.0
    send(redis_url, job=real, out=str(tmp_path / "forged"), request_id=request_id, reply_to=victim)
    doc = await_reply(r, victim, timeout=30)
    assert doc["status"] == "conflict" and doc["job_id"] is None and doc["results"] is None
    assert "already bound to a different request" in doc["errors"][0]
    # the squatter's own repeat (same request) is a duplicate as ever: the first job's document
    send(redis_url, job=forged, out=str(tmp_path / "forged"), request_id=request_id, reply_to=again)
    repeat = await_reply(r, again, timeout=30)
    assert repeat["status"] == "done" and repeat["results"][0]["score"] == 1.0
    # the same job in another suite (whose history it would write) is a different request too
    other = f"replies:{uuid.uuid4().hex}"
    send(redis_url, job=forged, out=str(tmp_path / "elsewhere"), request_id=request_id, reply_to=other,
         suite="rag-nightly")
    assert await_reply(r, other, timeout=30)["status"] == "conflict"
    assert not (tmp_path / "elsewhere").exists()
    time.sleep(0.5)
    assert r.llen(victim) == 0 and r.llen(again) == 0  # each answered once
