"""Fixtures for integration tests: a real Redis server and real Celery worker
processes, started here (the embedded-mode code) unless EVALQ_TEST_REDIS_URL
names a server to use. Never ``task_always_eager``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import redis

from tests.references.fixtures import azure, fmeval, ragas  # noqa: E402,F401  (peer libraries, session fixtures)

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = "tests.plugins.faulty,tests.plugins.echo_runner"

os.environ.setdefault("EVALQ_PLUGINS", PLUGINS)
# the test clusters' workers may send test keys to loopback only (judge-sim, moto)
os.environ.setdefault("EVALQ_ENDPOINTS", "*=http://127.0.0.1:*")
# ... and reach S3 (moto) on loopback only, in any bucket there
os.environ.setdefault("EVALQ_S3_ENDPOINTS", "http://127.0.0.1:*")
os.environ.setdefault("EVALQ_S3_PREFIXES", "s3://*")
# the test clusters' operator lets jobs share the budgets of the deployments they declare (the tests
# of a catalogue and of the other policies set their own)
os.environ.setdefault("EVALQ_INLINE_DEPLOYMENTS", "shared")
# test clusters start many jobs workers on one machine: the backlog endpoint only where a test asks
os.environ.setdefault("EVALQ_BACKLOG_PORT", "0")
# a key variable that is always set, for jobs that are validated but never call out
os.environ.setdefault("TEST_UNIT_API_KEY", "unit-test-key")
# embedded runs keep their judge cache here, not in the user's ~/.cache
os.environ.setdefault("EVALQ_CACHE_DIR", tempfile.mkdtemp(prefix="evalq-test-cache-"))
# The suite runs more processes than the machine has cores (Makefile: TEST_WORKERS), each with
# workers of its own. torch's OpenMP threads spin while they wait for work, taking the cores the
# others need: three copies of the bertscore engine's unit tests side by side on 2 cores took 340 s
# spinning and 114 s sleeping (112 s with one thread each). Set before any torch is imported here,
# and inherited by the workers the tests start; it changes no value, only how an idle thread waits.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


# -- how `make test` spreads the suite over its processes (pytest-xdist, --dist loadscope) --------
# A module is a unit of work (its cluster fixtures live in one process). xdist hands them out
# largest first by number of tests, so modules of few long tests (worker kills, model loads) came
# last and ran alone at the end while the other processes had finished: 4 to 5 minutes of a 15-minute
# suite on 2 cores. Here the longest modules go first (measured: `make test PYTEST_ARGS="--cpu-per-module
# F"`, each module's wall seconds summed), and the modules that compare with one peer library run in one
# process, which starts that library's reference process (tests/references) once instead of in each.
LONGEST_FIRST = [
    "tests/faults/test_faults.py", "tests/unit/test_bertscore_engine.py", "tests/integration/test_datasets.py",
    "tests/integration/test_sweeper.py", "tests/integration/test_defects.py", "tests/integration/test_worker_loss.py",
    "tests/integration/test_batch_mode.py", "tests/integration/test_tenant_attacks.py", "fmeval reference",
    "tests/integration/test_otel_export.py", "tests/integration/test_score_sinks.py",
    "tests/integration/test_tenant_share.py", "tests/integration/test_capacity.py",
    "tests/integration/test_fmeval_stereotyping.py", "tests/faults/test_chaos.py", "tests/integration/test_metrics.py",
    "tests/integration/test_node_client.py", "tests/integration/test_budget.py", "tests/integration/test_cli.py",
    "tests/integration/test_judges.py", "tests/integration/test_catalogue.py", "tests/integration/test_flower.py",
    "tests/integration/test_fmeval_variants.py", "tests/integration/test_resume_cancel.py",
    "tests/integration/test_trust_boundary.py", "tests/integration/test_identity.py",
    "tests/integration/test_llama_server.py", "tests/faults/test_partition.py", "tests/integration/test_history.py",
    "tests/integration/test_redis_auth_tls.py", "tests/integration/test_security.py", "ragas reference",
]
SHARED_REFERENCE = {
    "tests/fmeval/test_robustness.py": "fmeval reference", "tests/fmeval/test_classification.py": "fmeval reference",
    "tests/fmeval/test_text.py": "fmeval reference", "tests/integration/test_fmeval_pipeline.py": "fmeval reference",
    "tests/agents/test_agent_shapes.py": "ragas reference", "tests/agents/test_trajectory.py": "ragas reference",
}


def _scope(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    return SHARED_REFERENCE.get(module, module)


def pytest_addoption(parser):
    parser.addoption("--cpu-per-module", metavar="FILE", default=None,
                     help="append each module's CPU seconds (the test process and the children it waited "
                          "for: workers, `evalq` commands) to FILE as JSON lines: what to share first")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    path = item.config.getoption("--cpu-per-module")
    if not path:
        yield
        return
    import resource

    def used() -> float:
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    before, wall = used(), time.monotonic()
    yield
    with open(path, "a") as f:
        f.write(json.dumps({"module": item.nodeid.split("::", 1)[0], "test": item.nodeid,
                            "cpu": round(used() - before, 3), "wall": round(time.monotonic() - wall, 3)}) + "\n")


def pytest_collection_modifyitems(config, items):
    """The longest units first (a stable sort: the rest keep their order); every process sorts alike."""
    rank = {name: n for n, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(_scope(item.nodeid), len(rank)))


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadscope`` whose units are `_scope`'s, handed out in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    class LongestFirst(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

    if config.getoption("dist") != "loadscope":
        return None
    config.option.loadscopereorder = False  # the collection's order (above), not the number of tests
    return LongestFirst(config, log)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    explicit = os.environ.get("EVALQ_TEST_REDIS_URL")
    if explicit:
        yield explicit
        return
    from evalq.cli.embedded import EmbeddedRedis

    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def module_redis(tmp_path_factory):
    """A Redis of the module's own, for a module whose tests share one cluster (issue 76: a cluster a
    test cost the suite a Redis, ACL users and workers each time)."""
    from evalq.cli.embedded import EmbeddedRedis

    server = EmbeddedRedis(tmp_path_factory.mktemp("module-redis"))
    server.start()
    yield server.url
    server.stop()


@pytest.fixture
def private_redis(tmp_path):
    """A Redis of the test's own: no other test's jobs, queues or workers."""
    from evalq.cli.embedded import EmbeddedRedis

    (tmp_path / "redis").mkdir()
    server = EmbeddedRedis(tmp_path / "redis")
    server.start()
    yield server.url
    server.stop()


def start_worker(broker_url: str, queues: str, logdir: Path, concurrency: int = 2,
                 env: dict | None = None, name: str | None = None) -> subprocess.Popen:
    name = name or f"w{uuid.uuid4().hex[:6]}"
    log = open(logdir / f"{name}.log", "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "evalq.cli", "worker", "--broker", broker_url, "--queues", queues,
         "--concurrency", str(concurrency), "--hostname", f"{name}@%h", "--loglevel", "INFO"],
        cwd=ROOT, env={**os.environ, "EVALQ_PLUGINS": PLUGINS, **(env or {})},
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    proc.log_path = logdir / f"{name}.log"
    return proc


def wait_for_worker(broker_url: str, name_prefix: str, timeout: float = 30) -> None:
    from evalq.orchestrator.app import client_app

    app = client_app(broker_url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            replies = app.control.ping(timeout=0.5) or []
        except redis.ConnectionError:  # Redis closed the ping's connection (a test's ACL change, a loaded
            time.sleep(0.2)            # machine's timeout): ask again, as a person would
            continue
        if any(name.startswith(name_prefix) for reply in replies for name in reply):
            return
    raise TimeoutError(f"worker {name_prefix} did not answer a ping within {timeout}s")


def stop_worker(proc: subprocess.Popen, sig=None) -> None:
    import signal

    if proc.poll() is None:
        os.killpg(proc.pid, sig or signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def running_worker(broker_url: str, queues: str, logdir: Path, prefix: str, **kwargs):
    """A started worker for a fixture to yield (``yield from``): pinged before, stopped after."""
    name = f"{prefix}{uuid.uuid4().hex[:6]}"
    proc = start_worker(broker_url, queues, logdir, name=name, **kwargs)
    wait_for_worker(broker_url, name)
    try:
        yield proc
    finally:
        stop_worker(proc)


@pytest.fixture(scope="session")
def cpu_worker(redis_url, tmp_path_factory):
    """One prefork worker (2 processes) on the cpu and control queues."""
    name = f"cpu{uuid.uuid4().hex[:6]}"
    proc = start_worker(redis_url, "cpu", tmp_path_factory.mktemp("workers"), name=name)
    wait_for_worker(redis_url, name)
    yield proc
    stop_worker(proc)


# Commands that start nothing and leave nothing running: run in the test's own process (a
# subprocess is 0.4 s of CPU to import Python, click and evalq again; issue 76), through the same
# evalq.cli.invoke that turns errors into exit codes. Any other command, one given subprocess options
# (input, ...) or an environment for the interpreter itself (PYTHONPATH, ...) runs as a user runs it.
IN_PROCESS = frozenset({"validate", "metrics", "plan"})


def evalq(*args: str, env: dict | None = None, timeout: float = 240, **kw) -> subprocess.CompletedProcess:
    """Run the evalq CLI as a user would: a subprocess, or in-process for ``IN_PROCESS`` commands."""
    if args and args[0] in IN_PROCESS and not kw and not any(k.startswith("PYTHON") for k in env or {}):
        return evalq_in_process(*args, env=env)
    return subprocess.run([sys.executable, "-m", "evalq.cli", *args], cwd=ROOT,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout, **kw)


def evalq_in_process(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``evalq ARGS`` in this process, from the repository's root, with ``env`` over this process's
    environment (put back after): its exit code and what it wrote, as ``subprocess.run`` gives them,
    an exception that escaped as a traceback on stderr with exit code 1 (as Python would exit)."""
    import contextlib
    import io
    import traceback

    from evalq.cli import invoke
    from evalq.shared.data import parallel_read

    out, err = io.StringIO(), io.StringIO()
    saved, processes = dict(os.environ), parallel_read.READ_PROCESSES
    # one reading process: the command would fork readers from the test runner, whose other threads'
    # locks stay held in a forked child (a validate hung 300 s so); what reads in parallel is tested in
    # tests/unit/test_parallel_read.py and by the subprocesses here
    os.environ.update({"EVALQ_READ_PROCESSES": "1", **(env or {})})
    try:
        with contextlib.chdir(ROOT), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = invoke(list(args), prog_name="evalq")
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
            except Exception:  # noqa: BLE001  (what a subprocess would show)
                traceback.print_exc(file=err)
                code = 1
    finally:
        os.environ.clear()
        os.environ.update(saved)
        parallel_read.READ_PROCESSES = processes
    return subprocess.CompletedProcess(["evalq", *args], code, out.getvalue(), err.getvalue())


def write_job(path: Path, instances: list[dict], metrics: list[dict]) -> Path:
    path.write_text(json.dumps({"instances": instances, "metrics": metrics}))
    return path


def read_log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def read_results(out: Path) -> dict[str, dict]:
    """results.json by name or metric id (for jobs that list each metric once, or name the repeats)."""
    results = json.loads((out / "results.json").read_text())
    by_key = {m.get("name", m["metric"]): m for m in results}
    assert len(by_key) == len(results), "a metric is listed twice: read results.json as a list"
    return by_key


def _postgres_bin(name: str) -> str | None:
    import glob
    import shutil

    found = shutil.which(name) or sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found if isinstance(found, str) else (found[-1] if found else None)


@pytest.fixture(scope="session")
def postgres_url():
    """A PostgreSQL server of the tests' own (Debian's postgresql binaries; .ci/run installs
    them), on a free loopback port with its socket in a private directory, stopped at the end.
    PostgreSQL refuses to run as root: as root, the server runs as the ``postgres`` user."""
    import shutil

    from evalq.cli.embedded import free_port

    initdb, pg_ctl = _postgres_bin("initdb"), _postgres_bin("pg_ctl")
    if not initdb or not pg_ctl:
        pytest.skip("PostgreSQL's initdb/pg_ctl are not installed (apt-get install postgresql)")
    as_user: list[str] = []
    workdir = Path(tempfile.mkdtemp(prefix="evalq-pg-", dir="/tmp"))
    if os.geteuid() == 0:
        import pwd

        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to run PostgreSQL as")
        os.chown(workdir, user.pw_uid, user.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = workdir / "data", free_port()
    subprocess.run([*as_user, initdb, "-D", str(data), "-A", "trust", "-U", "evalq", "--no-sync"],
                   check=True, capture_output=True)
    subprocess.run([*as_user, pg_ctl, "-D", str(data), "-l", str(workdir / "log"), "-w", "-o",
                    f"-p {port} -k {workdir} -c listen_addresses=127.0.0.1 -c fsync=off", "start"],
                   check=True, capture_output=True, timeout=60)
    yield f"postgresql://evalq@127.0.0.1:{port}/postgres"
    subprocess.run([*as_user, pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"], capture_output=True,
                   timeout=60)
    shutil.rmtree(workdir, ignore_errors=True)


class WebhookListener:
    """An HTTP listener on 127.0.0.1 that keeps every JSON body POSTed to it and answers
    500 to the first ``fail_first`` of them."""

    def __init__(self):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        listener = self
        self.bodies: list[dict] = []
        self.fail_first = 0

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                listener.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(500 if len(listener.bodies) <= listener.fail_first else 200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # the path stands for a chat webhook's secret token: it must never be logged
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks/SECRET-TOKEN"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()


@pytest.fixture
def webhook(monkeypatch):
    """A webhook listener, named by EVALQ_ALERT_WEBHOOK for the test's own process."""
    listener = WebhookListener()
    monkeypatch.setenv("EVALQ_ALERT_WEBHOOK", listener.url)
    yield listener
    listener.stop()
