"""A worker cut off from Redis (a network partition, made with a network
namespace and a veth pair) for longer than the visibility timeout: its chunks
are done elsewhere, and its late results double nothing. Needs root and
iproute2 (CI's runner has both); skipped with the reason elsewhere."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest
import redis

from evalq.cli.embedded import free_port
from evalq.shared.cluster import keys
from tests.conftest import PLUGINS, ROOT, evalq, start_worker, stop_worker, wait_for_worker
from tests.faults.test_faults import FAST_REDELIVERY, comparable, pings, slow_job, wait_until

pytestmark = pytest.mark.integration


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def netns():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("a network partition needs root and iproute2 (ip netns)")
    tag = uuid.uuid4().hex[:5]
    name, host_if, ns_if = f"evq{tag}", f"evq{tag}a", f"evq{tag}b"
    subnet = f"10.{random.randint(100, 250)}.{random.randint(0, 250)}"
    try:
        ip("netns", "add", name)
        ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        ip("link", "set", ns_if, "netns", name)
        ip("addr", "add", f"{subnet}.1/24", "dev", host_if)
        ip("link", "set", host_if, "up")
        ip("netns", "exec", name, "ip", "addr", "add", f"{subnet}.2/24", "dev", ns_if)
        ip("netns", "exec", name, "ip", "link", "set", ns_if, "up")
        ip("netns", "exec", name, "ip", "link", "set", "lo", "up")
    except subprocess.CalledProcessError as exc:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        pytest.skip(f"cannot make a network namespace here: {exc.stderr.strip()}")
    yield name, f"{subnet}.1", host_if
    subprocess.run(["ip", "link", "del", host_if], capture_output=True)
    subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_a_worker_partitioned_past_the_visibility_timeout(netns, tmp_path):
    from tests.faults.test_faults import private_redis

    name, host_ip, host_if = netns
    job = slow_job(tmp_path / "job.json", n=60, seconds=0.1)
    clean = evalq("run", str(job), "--out", str(tmp_path / "clean"), "-q")
    assert clean.returncode == 0, clean.stderr
    data = tmp_path / "redis"
    data.mkdir()
    port = free_port()
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("needs a redis-server binary that can bind the veth address")
    server = subprocess.Popen([binary, "--bind", "127.0.0.1", host_ip, "--port", str(port), "--protected-mode", "no",
                               "--save", "", "--appendonly", "no", "--dir", str(data)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(lambda: pings(redis.Redis(port=port)), 10, "redis")
    local_url, remote_url = f"redis://127.0.0.1:{port}/0", f"redis://{host_ip}:{port}/0"
    log = open(tmp_path / "cut-off.log", "wb")
    cut_off = subprocess.Popen(
        ["ip", "netns", "exec", name, sys.executable, "-m", "evalq.cli", "worker", "--broker", remote_url,
         "--queues", "cpu", "--concurrency", "2", "--hostname", "cutoff@%h"],
        cwd=ROOT, env={**os.environ, "EVALQ_PLUGINS": PLUGINS, **FAST_REDELIVERY}, stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True)
    other = None
    try:
        wait_for_worker(local_url, "cutoff")
        proc = evalq("submit", str(job), "--out", str(tmp_path / "out"), "--broker", local_url)
        assert proc.returncode == 0, proc.stderr
        job_id = proc.stdout.strip()
        r = redis.Redis(port=port)
        wait_until(lambda: r.hlen(keys.results(job_id, "slow_len@0")) >= 10, what="progress")
        ip("link", "set", host_if, "down")  # the partition: no packet either way
        time.sleep(1.0)
        other = start_worker(local_url, "cpu", tmp_path, concurrency=2, name="healthy", env=FAST_REDELIVERY)
        proc = evalq("wait", job_id, "--broker", local_url)
        assert proc.returncode == 0, proc.stderr
        done = {k: r.hlen(k) for k in r.scan_iter(match=f"{keys.PREFIX}:*:res:*")}
        ip("link", "set", host_if, "up")  # the cut-off worker comes back with its late results
        time.sleep(8.0)
        assert {k: r.hlen(k) for k in r.scan_iter(match=f"{keys.PREFIX}:*:res:*")} == done
        assert r.scard(keys.chunks_done(job_id, "metrics")) == int(r.hget(keys.plan(job_id), "metrics:total"))
    finally:
        for w in (cut_off, other):
            if w is not None:
                stop_worker(w, signal.SIGKILL)
        server.terminate()
        server.wait(10)
    assert comparable(tmp_path / "out") == comparable(tmp_path / "clean")

