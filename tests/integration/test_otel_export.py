"""Issue 41: scores out as OpenTelemetry. Each item's result leaves the worker that scored it as a
``gen_ai.evaluation.result`` event through the SDK's OTLP/HTTP log exporter, to a receiver on
loopback that decodes every request with ``opentelemetry-proto`` (the protocol's own
definitions): parented to the span it judges, named, valued and labelled as results.json reads
the item; a named exporter of the operator's, or none; a worker killed mid-job loses and doubles
no event."""

from __future__ import annotations

import json
import os
import signal
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import redis

pytest.importorskip("opentelemetry.proto.collector.logs.v1.logs_service_pb2")

from opentelemetry.proto.collector.logs.v1 import logs_service_pb2  # noqa: E402

from evalq.cli.embedded import EmbeddedRedis  # noqa: E402
from evalq.cli.run import run_job  # noqa: E402
from evalq.shared.core.errors import JobError  # noqa: E402
from evalq.shared.job.schema import parse_job  # noqa: E402
from tests.conftest import read_log, start_worker, stop_worker, wait_for_worker  # noqa: E402
from tests.integration.test_otlp_traces import exported  # noqa: E402,F401  (the fixture)

pytestmark = pytest.mark.integration


class Receiver:
    """An OTLP/HTTP logs endpoint on loopback: every request decoded by opentelemetry-proto."""

    def __init__(self):
        self.events: list[dict] = []
        self.requests = 0
        self.refuse = 0  # requests to answer 400 (not retried by the exporter): a collector that says no
        self.answer: int | None = None  # a status for every request: a place that takes no OTLP logs
        self.asked = 0  # requests, whatever their answer
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.asked += 1
                if receiver.answer is not None:
                    self.send_response(receiver.answer)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if receiver.refuse > 0:
                    receiver.refuse -= 1
                    self.send_response(400)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                request = logs_service_pb2.ExportLogsServiceRequest()
                request.ParseFromString(body)
                for rl in request.resource_logs:
                    service = {a.key: a.value.string_value for a in rl.resource.attributes}.get("service.name")
                    for sl in rl.scope_logs:
                        for rec in sl.log_records:
                            attrs = {}
                            for a in rec.attributes:
                                v = a.value
                                attrs[a.key] = v.double_value if v.HasField("double_value") else v.string_value
                            receiver.events.append({"event_name": rec.event_name, "trace_id": rec.trace_id.hex(),
                                                    "span_id": rec.span_id.hex(), "attributes": attrs,
                                                    "service": service})
                receiver.requests += 1
                reply = logs_service_pb2.ExportLogsServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/logs"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


@pytest.fixture
def receivers():
    made = [Receiver(), Receiver()]
    yield made
    for r in made:
        r.close()


@pytest.fixture
def cluster(tmp_path, receivers):
    """A Redis and two cpu workers of the test's own, the first receiver their default exporter, the
    second named ``lab`` by the operator."""
    server = EmbeddedRedis(tmp_path)
    server.start()
    logs = tmp_path / "logs"
    logs.mkdir()
    env = {"OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": receivers[0].url, "EVALQ_OTEL_EXPORTERS": f"lab={receivers[1].url}",
           "EVALQ_VISIBILITY_TIMEOUT": "3"}
    names = [f"o{uuid.uuid4().hex[:4]}", f"p{uuid.uuid4().hex[:4]}"]
    workers = [start_worker(server.url, "cpu", logs, concurrency=1, env=env, name=n) for n in names]
    for n in names:
        wait_for_worker(server.url, n)
    yield server.url, workers
    for w in workers:
        stop_worker(w, signal.SIGKILL)
    server.stop()


def _job(folder, metrics, otel=None, **traces):
    """A job over the exported spans; every run scores them all (traces.once is tested apart)."""
    raw = {"dataset": {"uri": str(folder), "format": "otlp", "traces": {"once": False, **traces}},
           "metrics": metrics}
    if otel is not None:
        raw["output"] = {"otel": otel}
    return parse_job(raw)


def test_each_score_is_an_evaluation_event_parented_to_its_span(exported, cluster, receivers, tmp_path):
    folder, made = exported
    url, _ = cluster
    job = _job(folder, [{"id": "slow_len", "parameters": {"seconds": 0}}, {"id": "exact_match"}])
    run_job(job, tmp_path / "out", broker=url, progress=False, stall_timeout=120)
    otel = {inst["id"]: inst["otel"] for inst in job.instances}
    log = {(line["instance_id"], line["metric"]): line for line in read_log(tmp_path / "out")}
    events = receivers[0].events
    assert not receivers[1].events
    # slow_len scores every instance; exact_match needs references the traces lack: no events
    assert len(events) == len(otel) and {e["attributes"]["gen_ai.evaluation.name"] for e in events} == {"slow_len"}
    for e in events:
        assert e["event_name"] == "gen_ai.evaluation.result" and e["service"] == "evalq"
        span = e["span_id"]
        assert e["trace_id"] == otel[span]["trace_id"]
        assert e["attributes"]["gen_ai.evaluation.score.value"] == log[(span, "slow_len")]["result"]
    assert len({e["attributes"]["evalq.event.id"] for e in events}) == len(events)


def test_named_exporter_none_and_an_unknown_name(exported, cluster, receivers, tmp_path, monkeypatch):
    folder, _ = exported
    url, _ = cluster
    run_job(_job(folder, [{"id": "slow_len", "parameters": {"seconds": 0}}], otel="lab"), tmp_path / "a",
            broker=url, progress=False, stall_timeout=120)
    assert len(receivers[1].events) == 14 and not receivers[0].events
    run_job(_job(folder, [{"id": "slow_len", "parameters": {"seconds": 0}}], otel=False), tmp_path / "b",
            broker=url, progress=False, stall_timeout=120)
    assert len(receivers[1].events) == 14 and not receivers[0].events
    monkeypatch.setenv("EVALQ_OTEL_EXPORTERS", f"lab={receivers[1].url}")
    with pytest.raises(JobError, match="output.otel: no exporter named 'prod'"):
        _job(folder, [{"id": "slow_len"}], otel="prod")


def test_an_ordinary_datasets_scores_name_their_instances(cluster, receivers, tmp_path):
    """No span to parent to: the instance id goes as an attribute."""
    url, _ = cluster
    instances = [{"id": f"q{i}", "actual-output": "ok" * i, "expected-output": ["okok"]} for i in range(1, 5)]
    run_job(parse_job({"instances": instances, "metrics": [{"id": "exact_match"}]}), tmp_path / "out",
            broker=url, progress=False, stall_timeout=120)
    got = {e["attributes"]["evalq.instance.id"]: e for e in receivers[0].events}
    assert set(got) == {"q1", "q2", "q3", "q4"} and all(e["span_id"] == "" for e in got.values())
    assert [got[f"q{i}"]["attributes"]["gen_ai.evaluation.score.value"] for i in range(1, 5)] == [0.0, 1.0, 0.0, 0.0]


def test_a_worker_killed_mid_job_loses_and_doubles_no_event(exported, cluster, receivers, tmp_path):
    folder, _ = exported
    url, workers = cluster
    job = _job(folder, [{"id": "slow_len", "parameters": {"seconds": 0.15}}], unit="span")
    box = {}
    thread = threading.Thread(target=lambda: box.update(s=run_job(job, tmp_path / "out", broker=url, chunk_size=2,
                                                                  progress=False, stall_timeout=120)))
    thread.start()
    r = redis.Redis.from_url(url)
    while not any(r.hlen(k) for k in r.scan_iter(match="evalq:*:res:*")):
        pass
    os.killpg(workers[0].pid, signal.SIGKILL)
    thread.join(120)
    assert "s" in box
    ids = [e["attributes"]["evalq.event.id"] for e in receivers[0].events]
    assert len(ids) == len(set(ids)) == len(job.instances) == len(read_log(tmp_path / "out"))
    assert json.loads((tmp_path / "out" / "run.json").read_text())


def test_what_the_collector_refused_goes_at_the_end(exported, cluster, receivers, tmp_path):
    """The first requests are refused: those chunks' events are sent by the final callback, once."""
    folder, _ = exported
    url, _ = cluster
    receivers[0].refuse = 3
    job = _job(folder, [{"id": "slow_len", "parameters": {"seconds": 0}}], unit="span")
    run_job(job, tmp_path / "out", broker=url, chunk_size=3, progress=False, stall_timeout=120)
    ids = [e["attributes"]["evalq.event.id"] for e in receivers[0].events]
    assert receivers[0].refuse == 0 and len(ids) == len(set(ids)) == len(job.instances)
    # what was refused on the way is counted; in the end every item's events were taken
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["exports"]["otlp"]["sent"] == len(job.instances) and run["exports"]["otlp"]["unsent"] == 0


def test_a_place_that_takes_no_otlp_logs_is_found_at_once_and_said(exported, cluster, receivers, tmp_path, capsys):
    """Issue 60: Phoenix answered evalq's POST /v1/logs 405, ten times; `evalq run` printed only
    "wrote ...", took 19 s instead of 6, and run.json said nothing. A 405 (or 404) is found on the
    first request and not asked again; run.json, results.json and a line on stderr say what was
    not sent and what the place answered."""
    folder, _ = exported
    url, _ = cluster
    receivers[0].answer = 405
    job = _job(folder, [{"id": "slow_len", "parameters": {"seconds": 0}}], unit="span")
    run_job(job, tmp_path / "out", broker=url, chunk_size=3, progress=False, stall_timeout=120)
    n = len(job.instances)
    # one request (two at most: each of the two workers' first may leave before the other's answer)
    assert 1 <= receivers[0].asked <= 2 and not receivers[0].events
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    otlp = run["exports"]["otlp"]
    assert (otlp["sent"], otlp["unsent"]) == (0, n) and "405" in otlp["answer"], otlp
    [result] = json.loads((tmp_path / "out" / "results.json").read_text())
    assert result["exports"]["otlp"]["unsent"] == n and "405" in result["exports"]["otlp"]["answer"]
    said = capsys.readouterr().err
    assert f"evalq: {n} items' scores were not sent to otlp {receivers[0].url}: " in said and "405" in said, said
