"""The Redis fault drills of issue 72, shared by ``make test`` (one run of each,
tests/faults/test_redis_loss.py) and ``bench/bench_failover.py`` (each several times).

A drill is a loopback cluster as docs/how-to/cluster.md sets one up: a Redis without persistence
(or a primary, a replica and three sentinels), one ``evalq.jobs,cpu`` worker, one judge worker of
four threads, ``EVALQ_STORE`` a shared folder and ``EVALQ_JOURNAL`` the cluster's journal
(``evalq.shared.cluster.journal``); a job of bleu and coherence (judge-sim, 0.1 s a call) waited on
by ``evalq run --broker``; and one fault at a seeded point between 20% and 80% of the judging:

    flushall    ``FLUSHALL`` (what a Redis restarted without persistence leaves)
    replaced    Redis SIGKILLed and an empty one started on its port
    failover    ``SENTINEL FAILOVER``: the replica promoted, the old primary kept as a replica (READONLY)
    killed      the primary SIGKILLed under its sentinels, the replica promoted
    partition   the primary (in a network namespace) cut off from sentinels and workers for longer
                than ``down-after-milliseconds``, the replica promoted, then healed: the old primary
                comes back as a replica and its last writes are lost (needs root and iproute2)

Nothing here is mocked: real redis-server and sentinel processes, real workers, judge-sim on
loopback. The workers run under a supervisor, as a cluster's are (Kubernetes, compose's restart
policy): one that exits is started again, and the journal says so (``restart``): kombu 5.7 can give up
on a connection a failover broke ("Unrecoverable error") and exit. The journal's history checker says
what the fault cost."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import redis

from evalq.shared.cluster import journal
from evalq.sim import JudgeSim, Region
from tests.conftest import ROOT, read_log, start_worker, stop_worker, wait_for_worker
from tests.faults.test_faults import KEY, KEY_ENV, judge_job, pings, private_redis, wait_until

FAULTS = ("flushall", "replaced", "failover", "killed", "partition")
MASTER = "evalq-drill"
THREADS = 4  # the judge worker's
DOWN_AFTER_MS = 1000  # the sentinels' down-after-milliseconds
ENV = {KEY_ENV: KEY, "EVALQ_SWEEP_INTERVAL": "1", "EVALQ_RESUME_AFTER": "5", "EVALQ_CALLBACK_GRACE": "3",
       "EVALQ_VISIBILITY_TIMEOUT": "8", "EVALQ_SENTINEL_MASTER": MASTER}


@dataclass
class Outcome:
    fault: str
    point: float  # the share of the judging answered when the fault came
    returncode: int
    err: str  # what ``evalq run --broker`` said
    job: dict
    log: list[dict]  # log.jsonl
    answered: dict[str, int]  # judge-sim: calls answered per item
    verdict: journal.Verdict
    job_id: str
    seconds: float  # the client's, from submission to its exit
    restarts: int  # workers the supervisor started again (one exited)


def can_partition() -> str | None:
    """Why the partition cannot be drilled here, or None."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return "a network partition needs root and iproute2 (ip netns)"
    return None


def run(tmp_path: Path, fault: str, seed: int, n: int = 48, latency: float = 0.1) -> Outcome:
    assert fault in (*FAULTS, "none"), fault  # none: the same run undisturbed
    tmp_path.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    path = tmp_path / "journal.jsonl"
    # this process's: its notes (the fault, the workers alive) and the primary its pings ask the sentinels for
    before = {name: os.environ.get(name) for name in (journal.JOURNAL_ENV, "EVALQ_SENTINEL_MASTER")}
    os.environ.update({journal.JOURNAL_ENV: str(path), "EVALQ_SENTINEL_MASTER": MASTER})
    env = {**ENV, "EVALQ_STORE": str(tmp_path / "store"), journal.JOURNAL_ENV: str(path)}
    topology = Single(tmp_path) if fault in ("flushall", "replaced", "none") else \
        Sentinels(tmp_path, fault == "partition")
    workers = Supervisor(topology.url, tmp_path, env)
    try:
        with JudgeSim([Region("drill")], latency=latency, api_key=KEY, seed=seed, per_request=True) as sim:
            job = _job(tmp_path, sim, n)
            workers.start()
            for name in ("jobs", "judge"):
                wait_for_worker(topology.url, name, timeout=60)
            t0 = time.monotonic()
            waiting = subprocess.Popen(
                [sys.executable, "-m", "evalq.cli", "run", str(tmp_path / "job.json"), "--out", str(tmp_path / "out"),
                 "--broker", topology.url, "-q", "--stall-timeout", "120"], cwd=ROOT, env={**os.environ, **env},
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            point = rng.uniform(0.2, 0.8)
            wait_until(lambda: sum(sim.answered("drill").values()) >= point * n, 120, f"{point:.0%} of the judging")
            if fault != "none":
                journal.note("fault", kind=fault)
                topology.fault(fault)
            _, err = waiting.communicate(timeout=300)
            seconds = time.monotonic() - t0
            answered = sim.answered("drill")
            for name in ("jobs", "judge"):  # every worker answers and takes work after the fault
                wait_for_worker(topology.url, name, timeout=60)
                journal.note("alive", worker=name)
    finally:
        workers.stop()
        topology.close()
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    events = journal.read(path)
    job_id = next((e["job"] for e in events if e["event"] == "enqueue"), "")
    log = read_log(tmp_path / "out") if (tmp_path / "out" / "log.jsonl").exists() else []
    return Outcome(fault, point, waiting.returncode, err, job, log, answered, journal.check(events, job_id), job_id,
                   seconds, workers.restarts)


class Supervisor:
    """The drill's two workers, each started again when it exits (as a cluster's supervisor does)."""

    ROLES = (("evalq.jobs,cpu", 1, "jobs"), ("judge.drill", THREADS, "judge"))

    def __init__(self, url: str, logdir: Path, env: dict):
        self.url, self.logdir, self.env = url, logdir, env
        self.procs: dict[str, subprocess.Popen] = {}
        self.restarts = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> None:
        for queues, concurrency, name in self.ROLES:
            self.procs[name] = start_worker(self.url, queues, self.logdir, concurrency=concurrency, name=name,
                                            env=self.env)
        self.thread.start()

    def _watch(self) -> None:
        while not self.stopping.wait(0.2):
            for queues, concurrency, name in self.ROLES:
                if self.procs[name].poll() is not None and not self.stopping.is_set():
                    journal.note("restart", worker=name, exit=self.procs[name].returncode)
                    self.restarts += 1
                    self.procs[name] = start_worker(self.url, queues, self.logdir, concurrency=concurrency,
                                                    name=name, env=self.env)

    def stop(self) -> None:
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join(5)
        for proc in self.procs.values():
            stop_worker(proc)


def _job(tmp_path: Path, sim: JudgeSim, n: int) -> dict:
    path = judge_job(tmp_path, sim, "drill", "c", n, max_retries=0, timeout=30, rpm=1_000_000)
    job = json.loads(path.read_text())
    for i, inst in enumerate(job["instances"]):
        inst["expected-output"] = [f"a{i} the reference answer"]
    job["metrics"] = [{"id": "bleu", "parameters": {"smoothing_function": "method1"}}] + job["metrics"]
    path.write_text(json.dumps(job))
    return job


class Single:
    """One Redis without persistence."""

    def __init__(self, tmp_path: Path):
        self.dir = tmp_path
        self.proc, self.port = private_redis(tmp_path)
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def fault(self, kind: str) -> None:
        if kind == "flushall":
            redis.Redis(port=self.port).flushall()
            return
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        fresh = self.dir / f"fresh-{uuid.uuid4().hex[:6]}"
        fresh.mkdir()
        self.proc, _ = private_redis(fresh, port=self.port)  # empty, on the same port

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class Sentinels:
    """A primary, a replica and three sentinels; with ``partition`` the primary lives in a network
    namespace of its own, joined to this one by a veth pair."""

    def __init__(self, tmp_path: Path, partition: bool):
        self.procs: list[subprocess.Popen] = []
        self.netns = None
        host = "127.0.0.1"
        (tmp_path / "p").mkdir(exist_ok=True)
        (tmp_path / "r").mkdir(exist_ok=True)
        if partition:
            self.netns = Netns()
            host = self.netns.inside
            self.primary, self.p_port = self.netns.redis(tmp_path / "p")
        else:
            self.primary, self.p_port = private_redis(tmp_path / "p")
        self.replica, self.r_port = private_redis(tmp_path / "r", bind=self.netns.outside if partition else None)
        self.procs += [self.primary, self.replica]
        replica = redis.Redis(port=self.r_port)
        if partition:  # the replica as the primary (and so the sentinels) will see it, from the namespace
            replica.config_set("replica-announce-ip", self.netns.outside)
        replica.replicaof(host, self.p_port)
        self.ports = []
        for i in range(3):
            proc, port = _sentinel(tmp_path, i, host, self.p_port, partition)
            self.procs.append(proc)
            self.ports.append(port)
        wait_until(lambda: all(_knows_replica(port) for port in self.ports), 30, "the sentinels to see the replica")
        wait_until(lambda: redis.Redis(port=self.r_port).info("replication").get("master_link_status") == "up", 30,
                   "the replica in sync")
        self.url = ";".join(f"sentinel://127.0.0.1:{port}" for port in self.ports)

    def promoted(self) -> bool:
        try:
            return int(redis.Redis(port=self.ports[0]).sentinel_get_master_addr_by_name(MASTER)[1]) == self.r_port
        except redis.RedisError:
            return False

    def fault(self, kind: str) -> None:
        if kind == "failover":
            redis.Redis(port=self.ports[0]).execute_command("SENTINEL", "FAILOVER", MASTER)
        elif kind == "killed":
            self.primary.send_signal(signal.SIGKILL)
        else:
            self.netns.cut()
        wait_until(self.promoted, 60, "the replica promoted")
        if kind == "partition":
            time.sleep(DOWN_AFTER_MS / 1000)  # cut off a while longer, then healed
            self.netns.heal()

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(10)
        if self.netns is not None:
            self.netns.close()


class Netns:
    """A network namespace joined to this one by a veth pair; ``cut`` takes the namespace's end
    down (packets either way are dropped: connections hang, as across a real partition)."""

    def __init__(self):
        tag = uuid.uuid4().hex[:5]
        self.name, self.host_if, self.ns_if = f"evd{tag}", f"evd{tag}a", f"evd{tag}b"
        subnet = f"10.{random.randint(100, 250)}.{random.randint(0, 250)}"
        self.outside, self.inside = f"{subnet}.1", f"{subnet}.2"
        _ip("netns", "add", self.name)
        _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        _ip("link", "set", self.ns_if, "netns", self.name)
        _ip("addr", "add", f"{self.outside}/24", "dev", self.host_if)
        _ip("link", "set", self.host_if, "up")
        self._in("ip", "addr", "add", f"{self.inside}/24", "dev", self.ns_if)
        self._in("ip", "link", "set", self.ns_if, "up")
        self._in("ip", "link", "set", "lo", "up")

    def redis(self, folder: Path) -> tuple[subprocess.Popen, int]:
        from evalq.cli.embedded import free_port
        from tests.integration.test_redis_auth_tls import redis_binary

        port = free_port()
        proc = subprocess.Popen(["ip", "netns", "exec", self.name, redis_binary(False), "--bind", self.inside,
                                 "--port", str(port), "--protected-mode", "no", "--save", "", "--appendonly", "no",
                                 "--dir", str(folder)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: pings(redis.Redis(host=self.inside, port=port)), 10, "redis in the namespace")
        return proc, port

    def cut(self) -> None:
        self._in("ip", "link", "set", self.ns_if, "down")

    def heal(self) -> None:
        self._in("ip", "link", "set", self.ns_if, "up")

    def close(self) -> None:
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)

    def _in(self, *args: str) -> None:
        _ip("netns", "exec", self.name, *args)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _sentinel(tmp_path: Path, index: int, host: str, primary_port: int,
              announce: bool) -> tuple[subprocess.Popen, int]:
    from evalq.cli.embedded import free_port
    from tests.integration.test_redis_auth_tls import redis_binary

    port = free_port()
    conf = tmp_path / f"sentinel{index}.conf"
    conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\n"
                    f"sentinel monitor {MASTER} {host} {primary_port} 2\n"
                    f"sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}\n"
                    f"sentinel failover-timeout {MASTER} 5000\n"
                    + ("sentinel announce-ip 127.0.0.1\n" if announce else ""))  # one another, on loopback
    proc = subprocess.Popen([redis_binary(False), str(conf), "--sentinel"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    return proc, port


def _knows_replica(port: int) -> bool:
    try:
        return bool(redis.Redis(port=port).sentinel_slaves(MASTER))
    except redis.RedisError:
        return False




def check_undisturbed(out: Outcome) -> None:
    """What every drill must end with: the client's exit 0 (having said what it saw), every (instance,
    entry) once with the value it must have (nltk's BLEU computed directly; judge-sim's score as the
    item asks for it), and the history checker's verdict: no chunk lost, judge calls paid again within
    those in flight at the fault (judge-sim's own count agrees), both workers answering after it."""
    import pytest
    from nltk.tokenize import wordpunct_tokenize
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    assert out.returncode == 0 and "Traceback" not in out.err, out.err
    if out.fault in ("flushall", "replaced"):  # said whether it looked while the state was gone or after the rebuild
        assert "lost the job's state" in out.err and "rebuilt from the job store; going on" in out.err, out.err
    assert len({(line["instance_id"], line["metric"]) for line in out.log}) == len(out.log) == 2 * len(out.answered)
    by_id = {inst["id"]: inst for inst in out.job["instances"]}
    bleu = {line["instance_id"]: line["result"] for line in out.log if line["metric"] == "bleu"}
    assert bleu == pytest.approx({iid: sentence_bleu([wordpunct_tokenize(r) for r in inst["expected-output"]],
                                                     wordpunct_tokenize(inst["actual-output"]),
                                                     smoothing_function=SmoothingFunction().method1)
                                  for iid, inst in by_id.items()})
    assert {line["instance_id"]: line["result"]["score"] for line in out.log if line["metric"] == "coherence"} == \
        {iid: 1 + int(iid[1:]) % 5 for iid in by_id}
    verdict = out.verdict
    print(f"{out.fault} at {out.point:.0%} of the judging: {verdict.line()}; {out.restarts} workers restarted")
    assert verdict.chunks > 0 and verdict.lost == [], verdict.line()
    assert verdict.calls >= len(by_id) and verdict.repaid <= verdict.in_flight, verdict.line()
    assert len(out.answered) == len(by_id)
    assert sum(count - 1 for count in out.answered.values()) <= verdict.in_flight
    assert verdict.alive == {"jobs", "judge"}
    assert verdict.recovered_after is not None or verdict.in_flight == 0
