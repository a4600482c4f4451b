"""Chaos as an operator's drill: a private cluster (Redis with AOF, a jobs worker, a
2-process cpu worker, an 8-thread judge worker, each restarted by a supervisor
when it dies) runs a job of bleu, rouge and coherence against a deterministic
judge, undisturbed and then while workers (pool children included) are
SIGKILLed at seeded points and Redis is SIGKILLed and restarted (its instances staged in the job
store, the undisturbed run's kept in Redis: the outputs are the same). RELIABILITY.md
states the bound on judge calls paid again that the drill checks."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest
import redis

from evalq.sim import JudgeSim, Region
from tests.conftest import ROOT, evalq, read_log, start_worker, stop_worker, wait_for_worker
from tests.faults.test_faults import KEY, KEY_ENV, comparable, judge_job, private_redis, wait_until

pytestmark = pytest.mark.integration

THREADS = 8
CLUSTER_ENV = {
    KEY_ENV: KEY,
    # a whole worker's chunks come back soon; above the longest task (a Redis-error retry's countdown)
    "EVALQ_VISIBILITY_TIMEOUT": "8",
    # the sweeper (and the waiting client) look often and step in soon
    "EVALQ_SWEEP_INTERVAL": "1", "EVALQ_RESUME_AFTER": "5", "EVALQ_CALLBACK_GRACE": "3",
}


class Supervisor:
    """Keeps each worker role running, as compose's restart policy or Kubernetes does:
    a worker that exits (killed, or giving up on a lost broker) is started again."""

    def __init__(self, url: str, logdir: Path):
        self.url, self.logdir = url, logdir
        self.roles: dict[str, dict] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def add(self, role: str, queues: str, concurrency: int) -> None:
        self.roles[role] = {"queues": queues, "concurrency": concurrency, "starts": 0, "proc": None}
        self._start(role)

    def start(self) -> None:
        for role in self.roles:
            wait_for_worker(self.url, self.roles[role]["name"], timeout=60)
        self.thread.start()

    def proc(self, role: str) -> subprocess.Popen:
        with self.lock:
            return self.roles[role]["proc"]

    def deaths(self, role: str) -> int:
        with self.lock:
            return self.roles[role]["starts"] - 1

    def stop(self) -> None:
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join(10)
        for slot in self.roles.values():
            stop_worker(slot["proc"], signal.SIGKILL)

    def _start(self, role: str) -> None:
        slot = self.roles[role]
        slot["starts"] += 1
        slot["name"] = f"{role}{slot['starts']}x{uuid.uuid4().hex[:4]}"
        slot["proc"] = start_worker(self.url, slot["queues"], self.logdir, concurrency=slot["concurrency"],
                                    name=slot["name"], env=CLUSTER_ENV)

    def _watch(self) -> None:
        while not self.stopping.wait(0.1):
            with self.lock:
                for role, slot in self.roles.items():
                    if slot["proc"].poll() is not None and not self.stopping.is_set():
                        self._start(role)


def drill_job(tmp_path: Path, sim: JudgeSim, n: int) -> Path:
    """``judge_job``'s coherence instances, with references, scored by bleu and rouge too."""
    path = judge_job(tmp_path, sim, "chaos", "c", n, max_retries=0, timeout=30, rpm=1_000_000)
    job = json.loads(path.read_text())
    for i, inst in enumerate(job["instances"]):
        inst["expected-output"] = [f"a{i} the reference answer"]
    job["metrics"] = [{"id": "bleu"}, {"id": "rouge"}] + job["metrics"]
    path.write_text(json.dumps(job))
    return path


def kill_a_pool_child(cluster: Supervisor, role: str) -> None:
    """SIGKILL a pool child of the role's running worker once its pool has started. Celery gives up
    on a worker whose child dies before its consumer loop begins ("Could not start worker
    processes", checked once as the loop starts, just after "ready."): a death at start, which the
    supervisor answers with a new worker, not the death mid-job this drill is about."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        worker = cluster.proc(role)
        if worker.poll() is None and b" ready." in Path(worker.log_path).read_bytes():
            time.sleep(1.0)  # past the loop's start
            try:
                children = psutil.Process(worker.pid).children()
            except psutil.NoSuchProcess:
                children = []
            if children and worker.poll() is None:
                random.Random(worker.pid).choice(children).send_signal(signal.SIGKILL)
                return
        time.sleep(0.1)
    raise AssertionError(f"no started {role} pool to kill a child of")


def waiter_blocked(port: int) -> bool:
    """A client of this Redis (``evalq wait``) ran BLMOVE last: it waits on a job."""
    return any(c.get("cmd") == "blmove" for c in redis.Redis(port=port).client_list())


def in_flight_across(sim: JudgeSim, fault) -> int:
    """Calls in flight when ``fault()`` happened, as judge-sim counts them: those begun
    by just after it, less those ended by just before it (an upper bound)."""
    before = sim.stats("chaos")
    fault()
    return sim.stats("chaos")["requests"] - (before["requests"] - before["in_flight"])


def test_chaos_drill_pays_again_only_calls_in_flight_and_wait_rides_out_redis(tmp_path):
    n = 200
    data = tmp_path / "redis"
    data.mkdir()
    server, port = private_redis(data, aof=True)
    url = f"redis://127.0.0.1:{port}/0"
    cluster = Supervisor(url, tmp_path)
    rng = random.Random(25)
    with JudgeSim([Region("chaos")], latency=0.1, api_key=KEY, seed=25, per_request=True) as sim:
        job = drill_job(tmp_path, sim, n)
        try:
            cluster.add("jobs", "evalq.jobs", 1)
            cluster.add("cpu", "cpu", 2)
            cluster.add("judge", "judge.chaos", THREADS)
            cluster.start()
            clean = evalq("run", str(job), "--out", str(tmp_path / "clean"), "--broker", url, "-q",
                          env=CLUSTER_ENV)
            assert clean.returncode == 0, clean.stderr
            clean_calls = sim.stats("chaos")["ok"]
            sim.reset_stats()

            # the drill's job staged in the job store (Parquet parts), the clean run's kept in Redis
            submitted = evalq("submit", str(job), "--out", str(tmp_path / "out"), "--broker", url,
                              env={**CLUSTER_ENV, "EVALQ_STORE": str(tmp_path / "store"),
                                   "EVALQ_STORE_PART_BYTES": "8000"})
            assert submitted.returncode == 0, submitted.stderr
            job_id = submitted.stdout.strip()
            assert len(list((tmp_path / "store" / "default").glob(f"suite=*/job={job_id}/instances/*.parquet"))) > 1
            waiting = subprocess.Popen([sys.executable, "-m", "evalq.cli", "wait", job_id, "--broker",
                                        url, "--stall-timeout", "120"], cwd=ROOT, env={**os.environ, **CLUSTER_ENV},
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            # six workers (pool children included) and Redis once, each at a seeded point of the judge's progress
            events = ["judge", "judge", "cpu child", "cpu child", "cpu", "jobs", "redis"]
            rng.shuffle(events)
            points = sorted(rng.uniform(0.1, 0.8) for _ in events)
            in_flight_at_redis_kill, status = 0, None
            for event, point in zip(events, points):
                wait_until(lambda: sum(sim.answered().values()) >= point * n, 180, f"{point:.0%} of the judging")
                if event == "redis":
                    # the waiting client has started and looks after the job (it blocks on the job's
                    # ended list between looks): Redis gone and back before it started is no outage to it
                    wait_until(lambda: waiter_blocked(port), 60, "the waiting client")

                    def outage() -> None:
                        server.send_signal(signal.SIGKILL)  # no shutdown, no final save: only the AOF
                        server.wait(10)

                    in_flight_at_redis_kill = in_flight_across(sim, outage)
                    # a status asked for while Redis is away answers once it is back
                    status = subprocess.Popen([sys.executable, "-m", "evalq.cli", "status", job_id,
                                               "--broker", url], cwd=ROOT, env={**os.environ, **CLUSTER_ENV},
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                    time.sleep(3.0)
                    server, _ = private_redis(data, port=port, aof=True)
                elif event == "cpu child":
                    kill_a_pool_child(cluster, "cpu")
                else:
                    os.killpg(cluster.proc(event).pid, signal.SIGKILL)
            _, err = waiting.communicate(timeout=240)
            assert waiting.returncode == 0 and "Traceback" not in err, err
            assert "is unreachable" in err and "is back" in err, err
            shown, status_err = status.communicate(timeout=60)
            assert status.returncode == 0 and "Traceback" not in status_err, status_err
            assert f"job {job_id}:" in shown
            judge_deaths = cluster.deaths("judge")
        finally:
            cluster.stop()
            server.terminate()
            server.wait(10)
        calls, answered = sim.stats("chaos")["ok"], sim.answered("chaos")

    # every (instance, entry) once, equal to the undisturbed run
    log = read_log(tmp_path / "out")
    assert len({(line["instance_id"], line["metric"]) for line in log}) == len(log) == 3 * n
    assert comparable(tmp_path / "out") == comparable(tmp_path / "clean")
    # judge calls paid again: at most those in flight when a judge worker died or Redis was killed
    repaid = sum(count - 1 for count in answered.values())
    bound = THREADS * judge_deaths + in_flight_at_redis_kill
    print(f"chaos drill: {clean_calls} calls undisturbed, {calls} under faults ({repaid} paid again; bound "
          f"{bound}: {judge_deaths} judge worker deaths x {THREADS} threads + {in_flight_at_redis_kill} in "
          f"flight at the Redis kill)")
    assert clean_calls == n and len(answered) == n
    assert repaid <= bound and calls <= clean_calls + bound


def test_a_reply_answered_while_redis_is_down_is_written_when_it_is_back(tmp_path, monkeypatch):
    """One judge chunk run in this process: item 1's call is in flight when Redis is
    killed; its reply is held, written once Redis is back (AOF restart), and the
    chunk run again pays for items 2 and 3 only."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from evalq.orchestrator import submit
    from evalq.shared.cluster import keys
    from evalq.shared.job.schema import load_job
    from evalq.workers import chunk
    from evalq.workers.keeping import WRITE_BEHIND

    monkeypatch.setenv(KEY_ENV, KEY)
    data = tmp_path / "redis"
    data.mkdir()
    server, port = private_redis(data, aof=True)
    r = redis.Redis(port=port, retry=Retry(NoBackoff(), 0))  # fail at once while Redis is away
    with JudgeSim([Region("chaos")], latency=0.05, api_key=KEY, per_request=True) as sim:
        path = judge_job(tmp_path, sim, "chaos", "w", 4, max_retries=0, timeout=30, rpm=1_000_000)
        raw = json.loads(path.read_text())
        raw["instances"][1]["actual-output"] += " [[sim:delay=2]]"  # in flight long enough to kill Redis under it
        path.write_text(json.dumps(raw))
        job = load_job(path)
        job_id = submit.store_job(r, job, submit.job_spec(job))
        kept = keys.kept(job_id, "coherence@0")
        outcome: dict = {}

        def run() -> None:
            try:
                outcome["value"] = chunk.run_chunk(r, job_id, "coherence@0", 0, 4)
            except Exception as exc:  # surfaced below
                outcome["error"] = exc

        try:
            first = threading.Thread(target=run)
            first.start()
            wait_until(lambda: sim.stats("chaos")["in_flight"] == 1 and sum(sim.answered().values()) == 1,
                       30, "item 1 in flight")
            server.send_signal(signal.SIGKILL)
            server.wait(10)
            first.join(60)
            assert isinstance(outcome.get("error"), redis.ConnectionError), outcome  # item 2 found Redis gone
            held = WRITE_BEHIND.held(kept, ["0", "1", "2", "3"])
            assert list(held) == ["1"] and json.loads(held["1"])["record"]["result"]["score"] == 2
            server, _ = private_redis(data, port=port, aof=True)
            wait_until(lambda: WRITE_BEHIND.pending() == 0, 30, "held writes written")
            assert sorted(r.hkeys(kept)) == [b"0", b"1"]  # item 0 before the kill (AOF), item 1 after
            outcome.clear()
            run()
            assert outcome == {"value": {"metric": "coherence@0", "start": 0, "n": 4}}, outcome
            records = {int(p): json.loads(v) for p, v in r.hgetall(keys.results(job_id, "coherence@0")).items()}
            assert {p: rec["result"]["score"] for p, rec in records.items()} == {0: 1, 1: 2, 2: 3, 3: 4}
            assert r.hlen(kept) == 0  # the chunk's end moved them to its records
        finally:
            server.terminate()
            server.wait(10)
        assert sorted(sim.answered("chaos").values()) == [1, 1, 1, 1]  # no call paid twice


def test_a_worker_killed_holding_kombus_restore_lock_stalls_nothing_for_long(private_redis):
    """A chaos drill once stalled: a worker SIGKILLed while it held kombu's ``unacked_mutex`` (the
    lock around restoring a dead worker's messages) left it for kombu's default 300 s, and no
    message came back meanwhile. Every evalq worker now sets that lock to lapse with the visibility
    timeout (at least 10 s): the lock a dead holder leaves is gone as soon as its messages are due."""
    import redis
    from kombu import Connection

    from evalq.orchestrator.app import _transport_options
    from evalq.shared.core.config import Settings

    for vt, expected in ((8, 10), (60, 60), (3600, 300)):
        options = _transport_options(Settings(broker_url=None, visibility_timeout=vt, result_ttl=60))
        assert options["unacked_mutex_expire"] == expected
    # what a worker holding the lock leaves in Redis, through kombu's own code
    options = _transport_options(Settings(broker_url=None, visibility_timeout=8, result_ttl=60))
    with Connection(private_redis, transport_options=options) as conn:
        channel = conn.default_channel
        from kombu.transport.redis import Mutex

        with Mutex(channel.client, channel.unacked_mutex_key, channel.unacked_mutex_expire):
            ttl = redis.Redis.from_url(private_redis).ttl(channel.unacked_mutex_key)
    assert 0 < ttl <= 10
