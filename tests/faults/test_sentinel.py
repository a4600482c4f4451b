"""evalq on a Sentinel-managed Redis (issue 72): a primary, a replica and three sentinels on
loopback, workers and a client given the ``sentinel://`` URL Celery documents. A failover in the
middle of a job (``SENTINEL FAILOVER``: the old primary stays on as a replica, the READONLY path)
changes nothing: the job ends with every item once, and every worker answers ``inspect ping``
after it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from evalq.shared.cluster import keys
from tests.conftest import ROOT, read_log, start_worker, stop_worker, wait_for_worker
from tests.faults.test_faults import private_redis, slow_job, wait_until

pytestmark = pytest.mark.integration

MASTER = "evalq-primary"


def sentinel(tmp_path: Path, index: int, primary_port: int) -> tuple[subprocess.Popen, int]:
    from evalq.cli.embedded import free_port
    from tests.integration.test_redis_auth_tls import redis_binary

    port = free_port()
    conf = tmp_path / f"sentinel{index}.conf"
    conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\n"
                    f"sentinel monitor {MASTER} 127.0.0.1 {primary_port} 2\n"
                    f"sentinel down-after-milliseconds {MASTER} 1000\n"
                    f"sentinel failover-timeout {MASTER} 5000\n")
    proc = subprocess.Popen([redis_binary(False), str(conf), "--sentinel"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    return proc, port


def primary_port(port: int) -> int:
    return int(redis.Redis(port=port).sentinel_get_master_addr_by_name(MASTER)[1])


def test_a_job_rides_a_sentinel_failover_and_every_worker_answers_after_it(tmp_path, monkeypatch):
    monkeypatch.setenv("EVALQ_SENTINEL_MASTER", MASTER)  # this process's clients (the workers' ping)
    (tmp_path / "p").mkdir()
    (tmp_path / "r").mkdir()
    primary, p_port = private_redis(tmp_path / "p")
    replica, r_port = private_redis(tmp_path / "r")
    redis.Redis(port=r_port).replicaof("127.0.0.1", p_port)
    procs = [primary, replica]
    workers = []
    try:
        sentinels = [sentinel(tmp_path, i, p_port) for i in range(3)]
        procs += [proc for proc, _ in sentinels]
        ports = [port for _, port in sentinels]
        wait_until(lambda: all(_knows_replica(port) for port in ports), 30, "the sentinels to see the replica")
        url = ";".join(f"sentinel://127.0.0.1:{port}" for port in ports)
        env = {"EVALQ_SENTINEL_MASTER": MASTER, "EVALQ_SWEEP_INTERVAL": "1", "EVALQ_RESUME_AFTER": "5",
               "EVALQ_CALLBACK_GRACE": "3", "EVALQ_VISIBILITY_TIMEOUT": "8"}
        workers.append(start_worker(url, "evalq.jobs,cpu", tmp_path, concurrency=2, name="both", env=env))
        wait_for_worker(url, "both", timeout=60)
        job = slow_job(tmp_path / "job.json", n=48, seconds=0.25)
        run = subprocess.Popen([sys.executable, "-m", "evalq.cli", "run", str(job), "--out", str(tmp_path / "out"),
                                "--broker", url, "-q", "--stall-timeout", "120", "--chunk-size", "8"], cwd=ROOT,
                               env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        old = redis.Redis(port=p_port)
        # exact_match's 48 items come at once; then a third of slow_len's (chunks of 8)
        wait_until(lambda: _recorded(old) >= 64, 120, "a third of the slow entry")
        at = _recorded(old)
        redis.Redis(port=ports[0]).execute_command("SENTINEL", "FAILOVER", MASTER)
        wait_until(lambda: primary_port(ports[0]) == r_port, 30, "the replica promoted")
        _, err = run.communicate(timeout=240)
        assert run.returncode == 0 and "Traceback" not in err, err
        print(f"sentinel failover at {at} of 96 items recorded")
        assert at < 96  # in the middle of the job
        log = read_log(tmp_path / "out")
        assert len({(line["instance_id"], line["metric"]) for line in log}) == len(log) == 2 * 48
        wait_until(lambda: old.info("replication")["role"] == "slave", 30, "the old primary demoted")
        # every worker answers again (the chunks after the failover were the work they took again)
        wait_for_worker(url, "both", timeout=60)
    finally:
        for proc in workers:
            stop_worker(proc)
        for proc in procs:
            proc.terminate()
            proc.wait(10)


def _knows_replica(port: int) -> bool:
    try:
        return bool(redis.Redis(port=port).sentinel_slaves(MASTER))
    except redis.RedisError:
        return False


def _recorded(r: redis.Redis) -> int:
    try:
        return sum(int(r.get(k) or 0) for k in r.scan_iter(match=keys.recorded_total("*", "*")))
    except redis.RedisError:
        return 0


def test_a_sentinel_url_reads_as_its_hosts_credentials_and_database(monkeypatch):
    from evalq.shared.core.config import is_sentinel, safe_url, sentinel_master, sentinel_parts

    url = "sentinel://:s%40cret@10.0.0.1:26379/2;sentinel://10.0.0.2:26380;sentinel://10.0.0.3"
    assert is_sentinel(url) and not is_sentinel("redis://h:6379")
    assert sentinel_parts(url) == ([("10.0.0.1", 26379), ("10.0.0.2", 26380), ("10.0.0.3", 26379)], None,
                                   "s@cret", 2)
    assert "s%40cret" not in safe_url(url) and "10.0.0.1" in safe_url(url)
    monkeypatch.delenv("EVALQ_SENTINEL_MASTER", raising=False)
    assert sentinel_master() == "mymaster"
    monkeypatch.setenv("EVALQ_SENTINEL_MASTER", "night")
    assert sentinel_master() == "night"
    assert sentinel_parts("sentinel://u:p@h:1") == ([("h", 1)], "u", "p", 0)
