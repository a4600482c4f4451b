"""Issue 60: scores where teams already look. A night of an app's traces is in Phoenix (``phoenix
serve``) and in MLflow (``mlflow server`` on SQLite), both running for real on loopback, each from its
own venv (``make test`` builds them); evalq scores the night and writes every item's scores as Phoenix
span annotations and MLflow assessments on the spans and traces they judged, read back through each
backend's own client: once each through a worker killed mid-job and a backend that refuses for a
while; a sink that cannot take scores is found at once and said; nothing lost in silence."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import redis

pytest.importorskip("opentelemetry.exporter.otlp.json.file")
pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")

from google.protobuf import json_format  # noqa: E402
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2  # noqa: E402

from evalq.cli.embedded import EmbeddedRedis  # noqa: E402
from evalq.cli.run import run_job  # noqa: E402
from evalq.results.sinks import named_sink  # noqa: E402
from evalq.results.sinks.keeping import export_items  # noqa: E402
from evalq.shared.cluster import keys  # noqa: E402
from evalq.shared.core.errors import JobError  # noqa: E402
from evalq.shared.job.schema import parse_job  # noqa: E402
from evalq.shared.metrics.registry import REGISTRY  # noqa: E402
from evalq.shared.traces.events import evaluations  # noqa: E402
from evalq.sim import JudgeSim, Region  # noqa: E402
from tests.conftest import ROOT, evalq, read_log, start_worker, stop_worker, wait_for_worker  # noqa: E402
from tests.integration.test_otlp_traces import chat, hexes, provider  # noqa: E402

pytestmark = pytest.mark.integration

PHOENIX = ROOT / ".venv-phoenix" / "bin"
MLFLOW = ROOT / ".venv-mlflow" / "bin"
if not (PHOENIX / "phoenix").exists() or not (MLFLOW / "mlflow").exists():
    pytest.skip("Phoenix and MLflow are served from .venv-phoenix and .venv-mlflow, which `make test` builds",
                allow_module_level=True)

KEY_ENV = "TEST_SINK_JUDGE_API_KEY"
SECRET = "sk-sinks-" + uuid.uuid4().hex
N = 12          # chat spans in the night
HELD_BACK = 2   # the last spans, which never reach Phoenix (an exporter that dropped them)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url: str, proc: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited: {log.read_text(errors='replace')[-2000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {timeout} s: {log.read_text(errors='replace')[-2000:]}")


def serve(cmd: list[str], env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, env={**os.environ, **env}, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=log.parent)


def as_protobuf(line: str) -> bytes:
    """An OTLP JSON line (the SDK's file exporter: hex ids) as the protobuf request both backends take."""
    request = json.loads(line)
    for rs in request.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if span.get(key):
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    message = json_format.ParseDict(request, trace_service_pb2.ExportTraceServiceRequest(),
                                    ignore_unknown_fields=True)
    return message.SerializeToString()


@pytest.fixture(scope="module")
def backends(tmp_path_factory):
    """Phoenix and MLflow, served for real on loopback, each with a store of its own."""
    home = tmp_path_factory.mktemp("backends")
    phoenix_port, mlflow_port = free_port(), free_port()
    procs = [
        serve([str(PHOENIX / "phoenix"), "serve"],
              {"PHOENIX_WORKING_DIR": str(home / "phoenix"), "PHOENIX_PORT": str(phoenix_port),
               "PHOENIX_HOST": "127.0.0.1", "PHOENIX_GRPC_PORT": str(free_port()),
               "PHOENIX_TELEMETRY_ENABLED": "false"}, home / "phoenix.log"),
        serve([str(MLFLOW / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{home}/mlflow.db",
               "--default-artifact-root", str(home / "artifacts"), "--host", "127.0.0.1",
               "--port", str(mlflow_port), "--workers", "1"],
              # no job runner (MLflow 3's async jobs: seven huey consumers, 24 CPU-s of the suite, issue 76)
              {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}, home / "mlflow.log")]
    urls = {"phoenix": f"http://127.0.0.1:{phoenix_port}", "mlflow": f"http://127.0.0.1:{mlflow_port}"}
    try:
        wait_up(urls["phoenix"] + "/healthz", procs[0], home / "phoenix.log")
        wait_up(urls["mlflow"] + "/health", procs[1], home / "mlflow.log")
        yield urls
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            p.wait(30)


@pytest.fixture(scope="module")
def night(backends, tmp_path_factory):
    """An app's chat spans in a file (the dataset), sent to both backends as the app's exporter would:
    all of them to MLflow, all but the last ``HELD_BACK`` to Phoenix."""
    folder = tmp_path_factory.mktemp("night")
    path = folder / "traces.jsonl"
    tp = provider(path, f"shop-{uuid.uuid4().hex[:6]}")
    tracer = tp.get_tracer("app")
    spans = [hexes(chat(tracer, f"question {i}?", f"answer {i} [[sim:score={1 + i % 5}]]")) for i in range(N)]
    tp.shutdown()
    lines = path.read_text().splitlines()
    assert len(lines) == N  # one request per span (SimpleSpanProcessor)
    # (the app's exporter waits as long as a loaded machine's backends take: httpx's 5 s timed out once)
    experiment = httpx.post(backends["mlflow"] + "/api/2.0/mlflow/experiments/create", timeout=120,
                            json={"name": f"shop-{uuid.uuid4().hex[:6]}"}).json()["experiment_id"]
    for i, line in enumerate(lines):
        body = as_protobuf(line)
        headers = {"Content-Type": "application/x-protobuf"}
        assert httpx.post(backends["mlflow"] + "/v1/traces", content=body, timeout=120,
                          headers={**headers, "x-mlflow-experiment-id": experiment}).status_code == 200
        if i < N - HELD_BACK:
            assert httpx.post(backends["phoenix"] + "/v1/traces", content=body, headers=headers,
                              timeout=120).status_code == 200
    in_phoenix = {s for _, s in spans[:N - HELD_BACK]}
    deadline = time.monotonic() + 60  # Phoenix inserts what it receives a moment later
    while time.monotonic() < deadline:
        got = httpx.get(backends["phoenix"] + "/v1/projects/default/spans", params={"limit": 100}).json()["data"]
        if in_phoenix <= {s["context"]["span_id"] for s in got}:
            break
        time.sleep(0.5)
    else:
        raise TimeoutError("Phoenix did not show the night's spans")
    return path, spans


class Gate:
    """A loopback HTTP proxy in front of a backend: answers ``answer`` to everything, or 503 to the next
    ``refuse`` requests, or (``hang_up``) closes the connection without a word, and forwards the rest;
    counts what it was asked."""

    def __init__(self, target: str):
        self.target, self.refuse, self.answer, self.asked, self.hang_up = target, 0, None, 0, False
        gate = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                gate.asked += 1
                if gate.hang_up:  # as a backend that is not there: no status, no answer
                    self.close_connection = True
                    return
                if gate.answer or gate.refuse > 0:
                    code = gate.answer or 503
                    gate.refuse -= 0 if gate.answer else 1
                    self.send_response(code)
                    self.send_header("Content-Length", "12")
                    self.end_headers()
                    self.wfile.write(b"not now, sir")
                    return
                answer = httpx.request(self.command, gate.target + self.path, content=body,
                                       headers={k: v for k, v in self.headers.items() if k.lower() != "host"})
                self.send_response(answer.status_code)
                self.send_header("Content-Type", answer.headers.get("content-type", "application/json"))
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = _any

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def gates(backends):
    made = {"phoenix": Gate(backends["phoenix"]), "mlflow": Gate(backends["mlflow"])}
    yield made
    for g in made.values():
        g.close()


@pytest.fixture(scope="module")
def sim():
    with JudgeSim([Region("lab")], latency=0.01, api_key=SECRET, seed=5) as s:
        yield s


@pytest.fixture(scope="module")
def sinks_env(backends, gates):
    return {"EVALQ_SINKS": f"phx=phoenix+{backends['phoenix']};ml=mlflow+{backends['mlflow']};"
                           f"phx-gate=phoenix+{gates['phoenix'].url};ml-gate=mlflow+{gates['mlflow'].url};"
                           f"search:phx=phoenix+{backends['phoenix']}",
            "EVALQ_VISIBILITY_TIMEOUT": "3", KEY_ENV: SECRET}


@pytest.fixture(scope="module")
def cluster(sinks_env, tmp_path_factory):
    """A Redis, two cpu workers and a judge worker of the module's own, with the operator's sinks."""
    home = tmp_path_factory.mktemp("cluster")
    server = EmbeddedRedis(home)
    server.start()
    names = [f"s{uuid.uuid4().hex[:4]}", f"t{uuid.uuid4().hex[:4]}", f"j{uuid.uuid4().hex[:4]}"]
    workers = [start_worker(server.url, "cpu", home, concurrency=1, env=sinks_env, name=names[0]),
               start_worker(server.url, "cpu", home, concurrency=1, env=sinks_env, name=names[1]),
               start_worker(server.url, "judge.lab", home, concurrency=4, env=sinks_env, name=names[2])]
    for n in names:
        wait_for_worker(server.url, n)
    saved = {k: os.environ.get(k) for k in sinks_env}
    os.environ.update(sinks_env)  # the client's view of the operator's sinks (validation)
    yield server.url, workers
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    for w in workers:
        stop_worker(w, signal.SIGKILL)
    for w in workers:
        assert SECRET not in w.log_path.read_text(errors="replace")
    server.stop()


def job(path: Path, sim, sinks: list[str], *, judged: bool = True, seconds: float = 0) -> object:
    metrics = [{"id": "slow_len", "parameters": {"seconds": seconds}}]
    if judged:
        metrics.append({"id": "coherence", "parameters": {"judge": "sim", "threshold": 4}})
    return parse_job({
        "dataset": {"uri": str(path), "format": "otlp", "traces": {"once": False}},
        "judges": {"sim": {"provider": "openai", "model": "judge-sim", "api_key_env": KEY_ENV, "output": "json_schema",
                           "max_tokens": 100, "timeout": 5,
                           "deployments": [{"region": "lab", "base_url": sim.base_url("lab"), "tpm": 10_000_000,
                                            "rpm": 100_000}]}},
        "judging": {"cache": False}, "metrics": metrics, "output": {"sinks": sinks}})


def job_id_of(out: Path) -> str:
    return json.loads((out / "run.json").read_text())["job_id"]


class Reader:
    """A backend's own client in its own venv, imported once for the module (Phoenix's client takes ~9 s
    of CPU to import; a process per read cost the suite 28 CPU-s, issue 76): a process that takes a
    JSON list of arguments a line (``argv``) and answers a JSON line, ``out`` or the error."""

    def __init__(self, python: Path, prelude: str, body: str):
        script = ("import json, sys, traceback\n" + prelude + "\nfor line in sys.stdin:\n    argv = json.loads(line)\n"
                  "    try:\n" + "".join(f"        {row}\n" for row in body.splitlines()) +
                  "    except Exception:\n        out = {'error': traceback.format_exc()}\n"
                  "    print(json.dumps(out), flush=True)\n")
        self.proc = subprocess.Popen([str(python), "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, start_new_session=True)

    def ask(self, *argv: str):
        self.proc.stdin.write(json.dumps(list(argv)) + "\n")
        self.proc.stdin.flush()
        got = json.loads(self.proc.stdout.readline() or '{"error": "the reader exited"}')
        assert not (isinstance(got, dict) and "error" in got), got
        return got

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(30)


READERS: dict[str, Reader] = {}


@pytest.fixture(scope="module", autouse=True)
def readers():
    yield READERS
    for reader in READERS.values():
        reader.close()
    READERS.clear()


def phoenix_annotations(url: str, job_id: str, spans: list[str]) -> list[dict]:
    """The job's span annotations, read by Phoenix's own client."""
    if "phoenix" not in READERS:
        READERS["phoenix"] = Reader(PHOENIX / "python", "from phoenix.client import Client", (
            "got = Client(base_url=argv[0]).spans.get_span_annotations(span_ids=argv[2:], "
            "project_identifier='default', limit=10000)\n"
            "out = [a for a in got if (a.get('metadata') or {}).get('evalq.job.id') == argv[1]]"))
    return READERS["phoenix"].ask(url, job_id, *spans)


def mlflow_assessments(url: str, job_id: str, traces: list[str]) -> list[dict]:
    """The job's assessments on the traces, read by MLflow's own client."""
    if "mlflow" not in READERS:
        READERS["mlflow"] = Reader(MLFLOW / "python", "import mlflow", (
            "mlflow.set_tracking_uri(argv[0])\nout = []\n"
            "for tid in argv[2:]:\n"
            "    for a in mlflow.get_trace('tr-' + tid).info.assessments:\n"
            "        if (a.metadata or {}).get('evalq.job.id') == argv[1]:\n"
            "            out.append({'trace_id': tid, 'span_id': a.span_id, 'name': a.name, 'value': a.value,\n"
            "                        'source': [a.source.source_type, a.source.source_id],\n"
            "                        'rationale': a.rationale, 'label': a.metadata.get('evalq.label')})"))
    return READERS["mlflow"].ask(url, job_id, *traces)


def test_every_score_reaches_phoenix_and_mlflow_once_on_the_span_it_judged(night, backends, cluster, sim,
                                                                           tmp_path, capsys):
    path, spans = night
    url, _ = cluster
    out = tmp_path / "out"
    run_job(job(path, sim, ["phx", "ml"]), out, broker=url, chunk_size=4, progress=False, stall_timeout=180)
    job_id = job_id_of(out)
    log = {(line["instance_id"], line["metric"]): line for line in read_log(out)}
    assert len(log) == 2 * N
    trace_of = {s: t for t, s in spans}

    annotations = phoenix_annotations(backends["phoenix"], job_id, [s for _, s in spans])
    assert len(annotations) == 2 * (N - HELD_BACK)  # once each; the held-back spans are not in Phoenix
    for a in annotations:
        line = log[(a["span_id"], a["name"])]
        score = line["result"]["score"] if a["name"] == "coherence" else line["result"]
        assert a["result"]["score"] == pytest.approx(score)
        assert a["identifier"] == a["metadata"]["evalq.event.id"]
        if a["name"] == "coherence":
            assert a["annotator_kind"] == "LLM"
            assert a["result"]["label"] == ("pass" if score >= 4 else "fail")
            assert a["result"]["explanation"] == line["result"]["reason"]
        else:
            assert a["annotator_kind"] == "CODE" and a["result"]["label"] is None

    assessments = mlflow_assessments(backends["mlflow"], job_id, [t for t, _ in spans])
    assert len(assessments) == 2 * N == len({(a["span_id"], a["name"]) for a in assessments})
    for a in assessments:
        line = log[(a["span_id"], a["name"])]
        assert a["trace_id"] == trace_of[a["span_id"]]
        if a["name"] == "coherence":
            assert a["value"] == line["result"]["score"] and a["rationale"] == line["result"]["reason"]
            assert a["source"] == ["LLM_JUDGE", "sim"]
            assert a["label"] == ("pass" if line["result"]["score"] >= 4 else "fail")
        else:
            assert a["value"] == pytest.approx(line["result"]) and a["source"] == ["CODE", "evalq/slow_len"]

    # never lost in silence: what Phoenix did not take is counted, with its answer, and said
    run = json.loads((out / "run.json").read_text())
    assert run["exports"]["ml"] == {"kind": "mlflow", "endpoint": backends["mlflow"], "sent": 2 * N, "unsent": 0}
    phx = run["exports"]["phx"]
    assert (phx["sent"], phx["unsent"]) == (2 * (N - HELD_BACK), 2 * HELD_BACK) and "do not exist" in phx["answer"]
    assert phx["refused"] >= 2 * HELD_BACK  # refused in the chunk, and again at the job's end
    results = {m["metric"]: m for m in json.loads((out / "results.json").read_text())}
    assert results["coherence"]["exports"]["phx"]["unsent"] == HELD_BACK
    said = capsys.readouterr().err
    assert f"evalq: {2 * HELD_BACK} items' scores were not sent to phx {backends['phoenix']}: 404" in said, said
    assert "to ml " not in said


def test_a_worker_killed_mid_job_neither_loses_nor_doubles_a_score(night, backends, cluster, sim, tmp_path):
    path, spans = night
    url, workers = cluster
    out = tmp_path / "out"
    box = {}
    thread = threading.Thread(target=lambda: box.update(s=run_job(
        job(path, sim, ["phx", "ml"], judged=False, seconds=0.3), out, broker=url, chunk_size=2, progress=False,
        stall_timeout=180)))
    thread.start()
    r = redis.Redis.from_url(url)
    deadline = time.monotonic() + 60
    while not any(r.scard(k) for k in r.scan_iter(match="evalq:*:sink:ml:sent:*")) and time.monotonic() < deadline:
        time.sleep(0.02)
    os.killpg(workers[0].pid, signal.SIGKILL)
    thread.join(180)
    assert "s" in box
    job_id = job_id_of(out)
    annotations = phoenix_annotations(backends["phoenix"], job_id, [s for _, s in spans])
    assert sorted(a["span_id"] for a in annotations) == sorted(s for _, s in spans[:N - HELD_BACK])
    assessments = mlflow_assessments(backends["mlflow"], job_id, [t for t, _ in spans])
    assert sorted(a["span_id"] for a in assessments) == sorted(s for _, s in spans)  # each once
    run = json.loads((out / "run.json").read_text())
    assert (run["exports"]["ml"]["sent"], run["exports"]["ml"]["unsent"]) == (N, 0)
    # the worker killed is started again for the tests after this one
    workers[0] = start_worker(url, "cpu", workers[0].log_path.parent, concurrency=1,
                              env={k: os.environ[k] for k in ("EVALQ_SINKS", "EVALQ_VISIBILITY_TIMEOUT", KEY_ENV)},
                              name=f"s{uuid.uuid4().hex[:4]}")


def test_an_assessment_sent_by_a_process_that_died_before_marking_it_is_not_sent_again(night, backends, cluster):
    """The window a kill can hit: MLflow took an item's assessment, the process died before the mark.
    The position is pending and not marked; the next send asks MLflow and writes nothing twice."""
    _, spans = night
    url, _ = cluster
    r = redis.Redis.from_url(url)
    spec = {"sinks": ["ml"], "ttl": 600}
    job_id, key = f"died-{uuid.uuid4().hex[:6]}", "slow_len@0"
    entry = {"id": "slow_len", "parameters": {"seconds": 0}}
    items = [(i, {"instance_id": s, "result": float(i + 1), "otel": {"trace_id": t, "span_id": s}})
             for i, (t, s) in enumerate(spans[:3])]
    sink = named_sink(spec, "ml")
    kind = REGISTRY.get("slow_len").aggregation

    # what the dead process did: marked item 0 pending, sent it, and never marked it as taken
    r.hset(keys.sink_pending(job_id, key, "ml"), "0", "0")  # claimed before, and no longer held
    sink.send(job_id, key, entry, [(0, ev) for ev in evaluations(job_id, key, "slow_len", kind, {}, 0, items[0][1],
                                                                 items[0][1]["otel"])])
    assert export_items(r, sink, job_id, spec, key, entry, kind, items) == 2  # items 1 and 2 only
    assert export_items(r, sink, job_id, spec, key, entry, kind, items) == 0  # all marked now
    got = mlflow_assessments(backends["mlflow"], job_id, [t for t, _ in spans[:3]])
    assert sorted((a["span_id"], a["value"]) for a in got) == sorted((s, float(i + 1)) for i, (_, s) in
                                                                     enumerate(spans[:3]))


def test_two_processes_sending_the_same_items_at_once_write_each_assessment_once(night, backends, cluster):
    """A chunk run twice at once (its message delivered again while the first run still sends, as a
    loaded machine showed): the positions one process claimed are left to it, never sent twice; a
    claim given back is looked up first, then sent."""
    _, spans = night
    url, _ = cluster
    r = redis.Redis.from_url(url)
    spec = {"sinks": ["ml"], "ttl": 600}
    job_id, key = f"twice-{uuid.uuid4().hex[:6]}", "slow_len@0"
    entry = {"id": "slow_len", "parameters": {"seconds": 0}}
    items = [(i, {"instance_id": s, "result": float(i + 1), "otel": {"trace_id": t, "span_id": s}})
             for i, (t, s) in enumerate(spans[:6])]
    sink = named_sink(spec, "ml")
    kind = REGISTRY.get("slow_len").aggregation
    claims = keys.sink_pending(job_id, key, "ml")

    r.hset(claims, "0", f"{time.time() + 300}:another")  # another process is sending item 0 now
    assert export_items(r, sink, job_id, spec, key, entry, kind, items[:3]) == 2
    assert not r.sismember(keys.exported(job_id, key, "ml"), "0")  # left to the process that holds it
    r.hset(claims, "0", "0")  # it gave item 0 back unsent: looked up, then sent
    assert export_items(r, sink, job_id, spec, key, entry, kind, items[:3]) == 1

    sent = []
    start = threading.Barrier(4)

    def send():
        start.wait()
        sent.append(export_items(r, sink, job_id, spec, key, entry, kind, items[3:]))

    threads = [threading.Thread(target=send) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(sent) == [0, 0, 0, 3]  # one claimed the three; the others left them to it
    got = mlflow_assessments(backends["mlflow"], job_id, [t for t, _ in spans[:6]])
    assert sorted((a["span_id"], a["value"]) for a in got) == sorted((s, float(i + 1)) for i, (_, s) in
                                                                     enumerate(spans[:6]))


def test_a_backend_that_refuses_for_a_while_gets_everything_once_in_the_end(night, backends, gates, cluster, sim,
                                                                            tmp_path):
    path, spans = night
    url, _ = cluster
    gates["phoenix"].refuse, gates["mlflow"].refuse = 2, 5
    out = tmp_path / "out"
    run_job(job(path, sim, ["phx-gate", "ml-gate"], judged=False), out, broker=url, chunk_size=3, progress=False,
            stall_timeout=180)
    assert gates["phoenix"].refuse <= 0 and gates["mlflow"].refuse <= 0
    job_id = job_id_of(out)
    annotations = phoenix_annotations(backends["phoenix"], job_id, [s for _, s in spans])
    assert sorted(a["span_id"] for a in annotations) == sorted(s for _, s in spans[:N - HELD_BACK])
    assessments = mlflow_assessments(backends["mlflow"], job_id, [t for t, _ in spans])
    assert sorted(a["span_id"] for a in assessments) == sorted(s for _, s in spans)
    run = json.loads((out / "run.json").read_text())
    assert (run["exports"]["ml-gate"]["sent"], run["exports"]["ml-gate"]["unsent"]) == (N, 0)
    assert run["exports"]["ml-gate"]["refused"] >= 1  # counted on the way
    assert run["exports"]["phx-gate"]["sent"] == N - HELD_BACK


@pytest.mark.parametrize("kind", ["phoenix", "mlflow"])
def test_a_place_that_takes_no_scores_is_found_at_once_and_said(night, gates, cluster, sim, tmp_path, capsys, kind):
    """A 405 at the sink's path (a proxy, an old server, a URL that is not the backend): found on the
    first request, never asked again for the job, and said."""
    path, _ = night
    url, _ = cluster
    gate = gates[kind]
    gate.answer, gate.asked = 405, 0
    try:
        name = "phx-gate" if kind == "phoenix" else "ml-gate"
        run_job(job(path, sim, [name], judged=False), tmp_path / "out", broker=url, chunk_size=2, progress=False,
                stall_timeout=180)
        # one request per worker at most (each may ask before the other's answer is known), not one per chunk
        assert 1 <= gate.asked <= (2 if kind == "phoenix" else 2 * 8)
    finally:
        gate.answer = None
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    got = run["exports"][name]
    assert (got["sent"], got["unsent"]) == (0, N) and got["answer"].startswith("405"), got
    assert f"evalq: {N} items' scores were not sent to {name} {gate.url}: 405" in capsys.readouterr().err


def test_a_sink_no_backend_answers_for_is_counted_unreachable_not_refused(night, gates, cluster, sim, tmp_path):
    """Issue 74: a connection no backend answered on (closed without a word, refused, a client library
    missing) was counted with the scores a backend refused; it is counted apart, as unreachable."""
    path, _ = night
    url, _ = cluster
    gate = gates["phoenix"]
    gate.hang_up = True
    try:
        run_job(job(path, sim, ["phx-gate"], judged=False), tmp_path / "out", broker=url, chunk_size=2, progress=False,
                stall_timeout=180)
    finally:
        gate.hang_up = False
    got = json.loads((tmp_path / "out" / "run.json").read_text())["exports"]["phx-gate"]
    assert (got["sent"], got["unsent"]) == (0, N) and got["unreachable"] >= N and "refused" not in got, got
    [entry] = json.loads((tmp_path / "out" / "results.json").read_text())
    assert entry["exports"]["phx-gate"]["unreachable"] >= N


def test_a_night_whose_sink_took_nothing_is_sent_again_once_with_the_same_ids(night, backends, gates, cluster,
                                                                               sim, tmp_path):
    """Issue 74, item 2: a night whose export failed (MLflow behind a proxy that answered 405) is sent
    again once the operator mended it: ``evalq resend JOB``, every score once on its span, the job's own
    identifiers; a second resend asks the backend nothing."""
    path, spans = night
    url, _ = cluster
    gate = gates["mlflow"]
    gate.answer = 405
    try:
        run_job(job(path, sim, ["ml-gate"], judged=False), tmp_path / "out", broker=url, chunk_size=2,
                progress=False, stall_timeout=180)
    finally:
        gate.answer = None
    job_id = job_id_of(tmp_path / "out")
    assert json.loads((tmp_path / "out" / "run.json").read_text())["exports"]["ml-gate"]["sent"] == 0
    again = evalq("resend", job_id, "--broker", url)
    assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr
    assert f"job {job_id}: ml-gate (mlflow) has {N} items' scores; 0 not sent" in again.stdout
    assessments = mlflow_assessments(backends["mlflow"], job_id, [t for t, _ in spans])
    assert sorted(a["span_id"] for a in assessments) == sorted(s for _, s in spans)  # once each, on its span
    asked = gate.asked
    twice = evalq("resend", job_id, "--broker", url, "--json")
    assert twice.returncode == 0 and json.loads(twice.stdout)["ml-gate"]["entries"]["slow_len@0"]["sent"] == N
    assert gate.asked == asked and len(mlflow_assessments(backends["mlflow"], job_id, [t for t, _ in spans])) == N
    unknown = evalq("resend", "nosuchjob", "--broker", url)
    assert unknown.returncode == 1 and "no such job" in unknown.stderr and "Traceback" not in unknown.stderr


def test_sinks_are_the_operators_and_need_spans(night, cluster, sim, tmp_path):
    path, _ = night
    with pytest.raises(JobError, match="output.sinks: no sink named 'nope'"):
        job(path, sim, ["nope"])
    with pytest.raises(JobError, match=r"sink 'phx' \(phoenix\) writes each score on the span its item judged, and "
                                       "this job's instances carry none"):
        parse_job({"instances": [{"id": "a", "actual-output": "x"}], "metrics": [{"id": "slow_len"}],
                   "output": {"sinks": ["phx"]}})
    # another tenant's sink: refused when the request is taken, and again at export (the spec is not trusted)
    assert named_sink({"sinks": ["search:phx"], "scheduling": {"tenant": "ads"}}, "search:phx") is None
    assert named_sink({"sinks": ["search:phx"], "scheduling": {"tenant": "search"}}, "search:phx") is not None


def test_scores_go_only_onto_spans_read_from_a_trace_dataset(night, backends, cluster):
    """Issue 70, item 5. A job's own instances carrying an `otel` object took sinks, so `ads` could put
    annotations on any span and assessments on any trace in the shared Phoenix and MLflow; and a trace
    id `x/../../../../../ajax-api/2.0/mlflow/experiments/delete?` made the worker POST to MLflow's
    experiment deletion with the operator's token. Now `otel` is evalq's own field (only a trace
    dataset's instances carry it), and a sink takes only ids of the right hex length, quoted as a
    path segment."""
    _, spans = night
    trace, span = spans[0]
    with pytest.raises(JobError, match="'otel' is evalq's own field"):
        parse_job({"instances": [{"id": "a", "actual-output": "x", "otel": {"trace_id": trace, "span_id": span}}],
                   "metrics": [{"id": "slow_len"}], "output": {"sinks": ["ml"]}})
    # a record whose ids were made up reaches no backend, whatever got it into a record
    experiment = httpx.post(backends["mlflow"] + "/api/2.0/mlflow/experiments/create", timeout=120,
                            json={"name": f"victim-{uuid.uuid4().hex[:6]}"}).json()["experiment_id"]
    forged = f"x/../../../../../ajax-api/2.0/mlflow/experiments/delete?experiment_id={experiment}&"
    r = redis.Redis.from_url(cluster[0])
    spec, key, entry = {"sinks": ["ml"], "ttl": 600}, "slow_len@0", {"id": "slow_len", "parameters": {"seconds": 0}}
    job_id = f"forged-{uuid.uuid4().hex[:6]}"
    items = [(0, {"instance_id": span, "result": 1.0, "otel": {"trace_id": forged, "span_id": span}}),
             (1, {"instance_id": span, "result": 1.0, "otel": {"trace_id": trace.upper(), "span_id": span}})]
    sink = named_sink(spec, "ml")
    assert export_items(r, sink, job_id, spec, key, entry, REGISTRY.get("slow_len").aggregation, items) == 0
    got = httpx.get(backends["mlflow"] + "/api/2.0/mlflow/experiments/get", params={"experiment_id": experiment},
                    timeout=120).json()
    assert got["experiment"]["lifecycle_stage"] == "active", got
    assert not mlflow_assessments(backends["mlflow"], job_id, [trace])


RUNTIME = ROOT / ".venv-runtime" / "bin"


@pytest.mark.skipif(not (RUNTIME / "evalq").exists(), reason="the runtime-only venv .venv-runtime (make test builds it)")
def test_a_runtime_only_install_imports_every_module_and_exports_scores(night, backends, sim, tmp_path):
    """Issue 70, item 9. The sinks imported httpx, which evalq did not declare (openai 3.x depends on
    httpx2): every Phoenix, MLflow and OTLP-REST export of a `make demo` install ended
    ModuleNotFoundError, while `make test`'s extras hid it. Here evalq runs from a venv of its runtime
    dependencies alone (`make test` builds .venv-runtime as `make demo` builds .venv): every module
    imports, and an embedded `evalq run` of the night writes its scores into Phoenix."""
    script = ("import importlib, pkgutil, sys\nimport evalq\nbad = []\n"
              "for m in pkgutil.walk_packages(evalq.__path__, 'evalq.'):\n"
              "    if m.name.endswith('__main__') or m.name.startswith('evalq.results.migrations'):\n"
              "        continue  # a command, run when imported; alembic's scripts, which alembic runs\n"
              "    try:\n        importlib.import_module(m.name)\n"
              "    except Exception as exc:\n        bad.append(f'{m.name}: {type(exc).__name__}: {exc}')\n"
              "print('\\n'.join(bad))\nsys.exit(1 if bad else 0)")
    done = subprocess.run([str(RUNTIME / "python"), "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env={**os.environ, "EVALQ_PLUGINS": ""})
    assert done.returncode == 0, done.stdout + done.stderr
    path, _ = night
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps({
        "dataset": {"uri": str(path), "format": "otlp", "traces": {"once": False}},
        "judges": {"sim": {"provider": "openai", "model": "judge-sim", "api_key_env": KEY_ENV, "max_tokens": 100,
                           "deployments": [{"region": "lab", "base_url": sim.base_url("lab"), "tpm": 10_000_000,
                                            "rpm": 100_000}]}},
        "judging": {"cache": False}, "metrics": [{"id": "coherence", "parameters": {"judge": "sim"}}],
        "output": {"sinks": ["phx"]}}))
    env = {**os.environ, "EVALQ_PLUGINS": "", "EVALQ_SINKS": f"phx=phoenix+{backends['phoenix']}", KEY_ENV: SECRET}
    ran = subprocess.run([str(RUNTIME / "evalq"), "run", str(job_file), "--out", str(tmp_path / "out"), "-q"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    phx = json.loads((tmp_path / "out" / "run.json").read_text())["exports"]["phx"]
    # every judged item's score reached Phoenix but those of the spans it never had; an item whose judge
    # call failed (judge-sim's nonsense replies land on whichever calls come at them) has no score to
    # send: skipped, whether its span is in Phoenix or not
    _, spans = night
    scored = {line["instance_id"] for line in read_log(tmp_path / "out") if not line.get("error")}
    held = {s for _, s in spans[N - HELD_BACK:]}
    assert phx["kind"] == "phoenix" and phx["sent"] > 0, phx
    assert (phx["sent"], phx["unsent"]) == (len(scored - held), len(scored & held)), (phx, scored, held)
    assert phx["sent"] + phx["unsent"] + phx.get("skipped", 0) == N, phx


def people_write(kind: str, url: str, *argv: str):
    """People labelling where they look, through each backend's own client: a HUMAN span annotation in
    Phoenix (``spans.add_span_annotation``), a HUMAN feedback in MLflow (``mlflow.log_feedback``)."""
    key = f"{kind}-writer"
    if key not in READERS:
        if kind == "phoenix":
            READERS[key] = Reader(PHOENIX / "python", "from phoenix.client import Client", (
                "Client(base_url=argv[0]).spans.add_span_annotation(span_id=argv[1], annotation_name=argv[2], "
                "annotator_kind=argv[3], score=float(argv[4]), metadata={'annotator': argv[5]}, "
                "identifier='person-' + argv[5], sync=True)\nout = True"))
        else:
            READERS[key] = Reader(MLFLOW / "python", "import mlflow\nfrom mlflow.entities import AssessmentSource", (
                "mlflow.set_tracking_uri(argv[0])\n"
                "mlflow.log_feedback(trace_id='tr-' + argv[1], name=argv[3], value=float(argv[5]), span_id=argv[2], "
                "source=AssessmentSource(source_type=argv[4], source_id=argv[6]))\nout = True"))
    return READERS[key].ask(url, *argv)


def test_peoples_labels_in_phoenix_mlflow_and_a_file_come_back_once_each_on_their_item(night, backends, cluster,
                                                                                      sim, tmp_path):
    """Issue 75: people grade the night's judged items in Phoenix (two people), MLflow (one) and a file
    (one, and a line for an item no night judged); ``evalq labels`` brings each label into the history
    store once, on the item it grades, measures the judge against them (Krippendorff's alpha equal to
    the ``krippendorff`` package's on the same pairs), and the next night's report says it."""
    import krippendorff
    import numpy as np

    path, spans = night
    url, _ = cluster
    suite = f"labels-{uuid.uuid4().hex[:6]}"
    night_job = job(path, sim, ["phx", "ml"])
    night_job.suite = suite
    run_job(night_job, tmp_path / "n1", broker=url, chunk_size=4, progress=False, stall_timeout=180)
    job_id = job_id_of(tmp_path / "n1")
    judged = {line["instance_id"]: line["result"]["score"] for line in read_log(tmp_path / "n1")
              if line["metric"] == "coherence"}
    trace_of = {s: t for t, s in spans}

    def grade(k: int, who: str) -> int:  # a person agrees with the judge mostly, not always
        return max(1, min(5, judged[spans[k][1]] + (0, 0, 1, -1, 2, 0, 0, -2)[(k + len(who)) % 8]))

    given = []  # (instance, who, value): what people gave, counted here
    for k in range(6):
        for who in ("ana", "ben"):
            span = spans[k][1]
            people_write("phoenix", backends["phoenix"], span, "coherence", "HUMAN", str(grade(k, who)), who)
            given.append((span, who, grade(k, who)))
    people_write("phoenix", backends["phoenix"], spans[6][1], "coherence", "LLM", "1", "another-judge")  # not a person
    people_write("phoenix", backends["phoenix"], spans[7][1], "tone", "HUMAN", "2", "ana")  # no entry of that name
    for k in range(4, 9):
        span = spans[k][1]
        people_write("mlflow", backends["mlflow"], trace_of[span], span, "coherence", "HUMAN", str(grade(k, "cara")),
                     "cara")
        given.append((span, "cara", grade(k, "cara")))
    people_write("mlflow", backends["mlflow"], trace_of[spans[9][1]], spans[9][1], "coherence", "CODE", "1", "a-script")
    labels_file = tmp_path / "labels.jsonl"
    rows = [{"instance_id": spans[k][1], "name": "coherence", "value": grade(k, "dan"), "annotator": "dan"}
            for k in (9, 10, 11)]
    labels_file.write_text("\n".join(json.dumps(row) for row in [
        *rows, {"instance_id": "no-such-span", "name": "coherence", "value": 3}]) + "\n")
    given += [(row["instance_id"], "dan", row["value"]) for row in rows]

    read = evalq("labels", suite, "--from", "phx", "--from", "ml", "--file", str(labels_file), "--json")
    assert read.returncode == 0, read.stderr
    doc = json.loads(read.stdout)
    assert doc["labels"] == {"new": len(given), "updated": 0, "unchanged": 0, "unmatched": 1}
    from evalq.results.history import open_store
    from evalq.results.labels import labels_of

    kept = labels_of(open_store().engine, suite, job_id)
    assert sorted((r["instance_id"], r["annotator"], r["value"]) for r in kept) == sorted(given)
    assert {r["source"] for r in kept} == {"phoenix", "mlflow", "file"}
    [night1] = doc["nights"]
    got = night1["entries"]["coherence"]
    pairs = [(judged[span], value) for span, _, value in given]
    expected = krippendorff.alpha(reliability_data=np.array(list(zip(*pairs)), dtype=float),
                                  level_of_measurement="ordinal")
    assert night1["job_id"] == job_id and got["n"] == len(given) and got["annotators"] == 4
    assert got["alpha"] == pytest.approx(expected) and got["exact"] == pytest.approx(
        sum(a == b for a, b in pairs) / len(pairs))

    # asked again: nothing new; a person who changes a grade in Phoenix is an update, not a second label
    people_write("phoenix", backends["phoenix"], spans[0][1], "coherence", "HUMAN", "1", "ana")
    again = json.loads(evalq("labels", suite, "--from", "phx", "--from", "ml", "--file", str(labels_file),
                             "--json").stdout)
    assert again["labels"] == {"new": 0, "updated": 1, "unchanged": len(given) - 1, "unmatched": 1}
    shown = evalq("history", suite)
    assert "PEOPLE" in shown.stdout and f"coherence: {len(given)} label(s) by 4 people" in shown.stdout

    # the next night's report says how the judge fared against people on the last night they labelled;
    # it puts its items near the pass threshold (3 or 4 against 4) in front of people, marked on their
    # spans in Phoenix and their traces in MLflow
    from evalq.shared.job.nightly import Review

    # ... and reads, itself, what people gave the night before on its sinks since: ben changes a grade
    assert grade(1, "ben") >= 3  # (two points over the judge's score, at least 1)
    people_write("phoenix", backends["phoenix"], spans[1][1], "coherence", "HUMAN", "1", "ben")
    night_job.review = Review(items=4, random=0)
    run_job(night_job, tmp_path / "n2", broker=url, chunk_size=4, progress=False, stall_timeout=180)
    ben = {r["instance_id"]: r["value"] for r in labels_of(open_store().engine, suite, job_id) if r["annotator"] == "ben"}
    assert ben[spans[1][1]] == 1 and len(ben) == 6
    page = (tmp_path / "n2" / "report.html").read_text()
    assert f"<th>judges vs people</th><td>night {job_id}" in page
    run2 = json.loads((tmp_path / "n2" / "run.json").read_text())
    said = run2["regressions"]["people"]
    assert said["job_id"] == job_id and said["entries"]["coherence"]["n"] == len(given)
    near = {span for span, score in judged.items() if score in (3, 4)}  # the same judge-sim, the same scores
    rows = [json.loads(line) for line in (tmp_path / "n2" / "review.jsonl").read_text().splitlines()]
    assert len(rows) == min(4, len(near)) and {r["instance_id"] for r in rows} <= near
    assert all(r["reasons"][0]["reason"] == "near the threshold" for r in rows)
    chosen = {r["instance_id"] for r in rows}
    in_phoenix = {s for _, s in spans[:N - HELD_BACK]}
    marks = [a for a in phoenix_annotations(backends["phoenix"], job_id_of(tmp_path / "n2"), [s for _, s in spans])
             if a["name"] == "needs_review"]
    assert {a["span_id"] for a in marks} == chosen & in_phoenix and all(a["result"]["label"] == "needs review"
                                                                      for a in marks)
    assert run2["review"]["marked"] == {"phx": len(chosen & in_phoenix), "ml": len(chosen)}
    if "mlflow-tags" not in READERS:
        READERS["mlflow-tags"] = Reader(MLFLOW / "python", "import mlflow", (
            "mlflow.set_tracking_uri(argv[0])\n"
            "out = {tid: mlflow.get_trace('tr-' + tid).info.tags.get('evalq.needs_review') for tid in argv[1:]}"))
    tags = READERS["mlflow-tags"].ask(backends["mlflow"], *[t for t, _ in spans])
    assert {s for t, s in spans if tags[t]} == chosen
    assert all("near the threshold" in tags[trace_of[s]] for s in chosen)
