"""`evalq flower`: real Flower on the test broker, read through its HTTP API."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid

import pytest

from tests.conftest import ROOT, evalq

pytestmark = pytest.mark.integration

USER, PASSWORD = "ops", "pw-" + uuid.uuid4().hex


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, auth: tuple[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def start_flower(tmp_path, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    """`evalq flower` on the broker named in ``env``, behind basic auth, logging to
    tmp_path/flower.log; returns (process, base URL) once it answers."""
    port = free_port()
    log = open(tmp_path / "flower.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "evalq.cli", "flower", "--port", str(port)],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, **env, "EVALQ_FLOWER_BASIC_AUTH": f"{USER}:{PASSWORD}"},
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, (tmp_path / "flower.log").read_text(errors="replace")
        try:
            if get(base + "/healthcheck")[0] == 200:
                return proc, base
        except OSError:
            pass
        assert time.monotonic() < deadline, "Flower did not start"
        time.sleep(0.2)


def stop_flower(proc: subprocess.Popen) -> None:
    # Flower 2.2's SIGTERM handler raises SystemExit wherever the main thread is; landing in a
    # finalizer (redis-py's Redis.__del__, seen once in a full run) it is ignored and Flower runs
    # on. An operator's second SIGTERM (or the pod's SIGKILL) ends it; so does the test's.
    for _ in range(2):
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
            return
        except subprocess.TimeoutExpired:
            pass
    raise AssertionError("Flower did not stop on SIGTERM, twice")


@pytest.fixture
def flower(redis_url, tmp_path):
    proc, base = start_flower(tmp_path, {"EVALQ_BROKER_URL": redis_url})
    yield base
    stop_flower(proc)
    assert PASSWORD not in (tmp_path / "flower.log").read_text(errors="replace")


def test_flower_shows_the_jobs_tasks_to_those_with_credentials(redis_url, cpu_worker, flower, tmp_path):
    time.sleep(2.0)  # Flower's event consumer is attached shortly after its HTTP server
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"instances": [{"id": f"i{i}", "actual-output": "a b", "expected-output": ["a b"]}
                                              for i in range(6)], "metrics": [{"id": "exact_match"}]}))
    proc = evalq("submit", str(path), "--out", str(tmp_path / "out"), "--chunk-size", "2", "--broker", redis_url)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    assert evalq("wait", job_id, "--broker", redis_url).returncode == 0

    deadline = time.monotonic() + 30
    while True:
        status, body = get(flower + "/api/tasks?limit=1000", auth=(USER, PASSWORD))
        assert status == 200, body
        tasks = [t for t in json.loads(body).values() if job_id in (t.get("args") or "")]
        if len([t for t in tasks if t["name"] == "evalq.score_chunk" and t["state"] == "SUCCESS"]) == 3 \
                and any(t["name"] == "evalq.finalize" for t in tasks):
            break
        assert time.monotonic() < deadline, tasks
        time.sleep(0.5)
    chunks = sorted(t["args"] for t in tasks if t["name"] == "evalq.score_chunk")
    # arguments say which job, which metric entry and which instance range
    assert chunks == [f"['{job_id}', 'exact_match@0', {a}, {b}]" for a, b in ((0, 2), (2, 4), (4, 6))] or \
        chunks == [f"('{job_id}', 'exact_match@0', {a}, {b})" for a, b in ((0, 2), (2, 4), (4, 6))]

    assert get(flower + "/api/tasks")[0] == 401
    assert get(flower + "/api/tasks", auth=(USER, "wrong"))[0] == 401
    assert get(flower + "/", auth=None)[0] == 401


@pytest.mark.parametrize("args,env,fragment", [
    ([], {}, "Flower needs credentials"),
    (["--no-auth", "--address", "0.0.0.0"], {}, "only on a loopback address"),
    (["--basic-auth", "nopassword"], {}, "expected USER:PASSWORD"),
    (["--no-auth"], {"EVALQ_FLOWER_BASIC_AUTH": "a:b"}, "exclude each other"),
])
def test_flower_refuses_to_start_without_credentials(redis_url, args, env, fragment):
    clean = {k: v for k, v in os.environ.items() if k != "EVALQ_FLOWER_BASIC_AUTH"}
    proc = subprocess.run([sys.executable, "-m", "evalq.cli", "flower", "--broker", redis_url, *args],
                          cwd=ROOT, env={**clean, **env}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert fragment in proc.stderr


@pytest.mark.parametrize("tls", [False, True], ids=["auth", "tls+auth"])
def test_flower_on_a_redis_with_a_password_and_tls(tmp_path, tls):
    """Flower follows a cluster whose Redis wants a password (and TLS, verified against
    a private CA): it sees the workers and the job's tasks, and its log and pages never
    show the Redis password."""
    from tests.conftest import start_worker, stop_worker, wait_for_worker
    from tests.integration.test_redis_auth_tls import PASSWORD as REDIS_PASSWORD, secure_redis

    server, url, env = secure_redis(tmp_path, tls)
    name = f"fl{uuid.uuid4().hex[:6]}"
    worker = start_worker(url, "cpu", tmp_path, concurrency=1, name=name, env=env)
    flower, pages = None, []
    try:
        with pytest.MonkeyPatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            wait_for_worker(url, name)
        flower, base = start_flower(tmp_path, env)
        time.sleep(2.0)  # its event consumer attaches shortly after the HTTP server
        path = tmp_path / "job.json"
        path.write_text(json.dumps({"instances": [{"id": f"i{i}", "actual-output": "a", "expected-output": ["a"]}
                                                  for i in range(4)], "metrics": [{"id": "exact_match"}]}))
        proc = evalq("submit", str(path), "--out", str(tmp_path / "out"), "--chunk-size", "2", env=env)
        assert proc.returncode == 0, proc.stderr
        job_id = proc.stdout.strip()
        assert evalq("wait", job_id, env=env).returncode == 0
        deadline = time.monotonic() + 30
        while True:
            status, body = get(base + "/api/tasks?limit=1000", auth=(USER, PASSWORD))
            assert status == 200, body
            pages.append(body.decode(errors="replace"))
            done = [t for t in json.loads(body).values()
                    if job_id in (t.get("args") or "") and t["name"] == "evalq.score_chunk" and t["state"] == "SUCCESS"]
            if len(done) == 2:
                break
            assert time.monotonic() < deadline, body[:2000]
            time.sleep(0.5)
        status, body = get(base + "/api/workers?refresh=1", auth=(USER, PASSWORD))
        assert status == 200 and any(w.startswith(name) for w in json.loads(body)), body[:2000]
        pages.append(body.decode(errors="replace"))
        for page in ("/", "/workers", "/tasks", "/broker"):
            pages.append(get(base + page, auth=(USER, PASSWORD))[1].decode(errors="replace"))
    finally:
        if flower is not None:
            stop_flower(flower)
        stop_worker(worker)
        server.terminate()
        server.wait(10)
    texts = pages + [(tmp_path / "flower.log").read_text(errors="replace"),
                     worker.log_path.read_text(errors="replace")]
    assert not any(REDIS_PASSWORD in t for t in texts)
