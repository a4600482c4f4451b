"""Worker metrics without a cluster: off means nothing at all (no prometheus_client, no directory,
no server); a prepared node's processes, forked ones included, add up in one /metrics; and the
jobs role's collector yields what it can when Redis or the history store fails.
(tests/integration/test_metrics.py runs real worker nodes.)"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from datetime import datetime, timezone
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from evalq.cli.embedded import free_port
from evalq.orchestrator.jobs_metrics import SUITE_AGE_ENV, JobsCollector, SuiteBounds, suite_rows

ROOT = Path(__file__).resolve().parents[2]


def python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("EVALQ_METRICS_PORT", "PROMETHEUS_MULTIPROC_DIR", "EVALQ_METRICS_NODE_DIR")}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env={**clean, **env},
                          capture_output=True, text=True, timeout=60)


def test_off_counts_nothing_and_never_imports_prometheus_client(tmp_path):
    code = """
        import os, sys
        from evalq.shared.cluster import telemetry
        telemetry.items_recorded("exact_match", "cpu", [{"result": 1}, {"error": "x"}])
        telemetry.judge_counted("lab", {"calls": 1, "prompt_tokens": 5, "cost_nano": 10})
        telemetry.judge_counted(None, {"cache_hits": 1})
        telemetry.budget_admitted("lab", 100)
        telemetry.deployment_limits([("lab", 1000, 10)])
        telemetry.process_exit(os.getpid())
        assert telemetry.serve() is None
        assert not telemetry.enabled()
        assert "prometheus_client" not in sys.modules, "imported while off"
        print("ok")
    """
    # unset; and a PROMETHEUS_MULTIPROC_DIR of some other program's does not turn it on
    for env in ({}, {"EVALQ_METRICS_PORT": "9999", "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}):
        done = python(code, env)
        assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    assert not list(tmp_path.iterdir())


def test_a_nodes_processes_add_up_in_one_scrape():
    code = """
        import os, socket, urllib.request
        from evalq.shared.cluster import telemetry
        path = telemetry.prepare()
        assert telemetry.enabled() and os.environ["PROMETHEUS_MULTIPROC_DIR"] == path
        children = []
        for n in range(3):  # forked processes, as a prefork pool's
            pid = os.fork()
            if pid == 0:
                telemetry.items_recorded("exact_match", "cpu", [{"result": 1}] * (n + 1) + [{"skipped": "cap"}])
                telemetry.judge_counted("lab", {"calls": 1, "cost_nano": 1_500_000_000, "completion_tokens": 7})
                telemetry.deployment_limits([("lab", 1000 * (n + 1), 10)])
                telemetry.scores_exported("otlp", "refused", n + 1)
                telemetry.process_exit(os.getpid())
                os._exit(0)
            os.waitpid(pid, 0)
        telemetry.judge_counted(None, {"cache_hits": 2, "reused": 1})  # this process counts too
        telemetry.deployment_limits([("self", "auto", None)])  # learned, or none stated: not a number
        telemetry.concurrency_limit("self", 6)
        server = telemetry.serve()
        port = server.server_address[1]
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        print(path)
        print(text)
    """
    done = python(code, {"EVALQ_METRICS_PORT": str(free_port()), "EVALQ_METRICS_HOST": "127.0.0.1"})
    assert done.returncode == 0, done.stderr
    from prometheus_client.parser import text_string_to_metric_families

    path, text = done.stdout.split("\n", 1)
    assert path.startswith(("/tmp", os.environ.get("TMPDIR", "/tmp"))) and not Path(path).exists()  # removed at exit
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("evalq_items_scored_total", (("metric", "exact_match"), ("queue", "cpu")))] == 1 + 2 + 3
    assert samples[("evalq_items_skipped_total", (("metric", "exact_match"),))] == 3
    assert samples[("evalq_judge_calls_total", (("deployment", "lab"),))] == 3
    assert samples[("evalq_judge_cost_total", (("deployment", "lab"),))] == 4.5
    assert samples[("evalq_judge_tokens_total", (("deployment", "lab"), ("kind", "completion")))] == 21
    assert samples[("evalq_judge_cache_hits_total", (("deployment", "cache"),))] == 2
    assert samples[("evalq_judge_cache_hits_total", (("deployment", "reuse"),))] == 1
    assert samples[("evalq_budget_tpm", (("deployment", "lab"),))] == 3000  # the last one set
    assert ("evalq_budget_tpm", (("deployment", "self"),)) not in samples  # its learner sets it as it reads it
    assert samples[("evalq_concurrency_limit", (("deployment", "self"),))] == 6
    assert samples[("evalq_scores_exported_total", (("outcome", "refused"), ("sink", "otlp")))] == 1 + 2 + 3


@pytest.fixture(autouse=True)
def old_suites_shown(monkeypatch):
    """The rows here ended in January 2026: older than the default 30 days of suite series."""
    monkeypatch.setenv(SUITE_AGE_ENV, str(10 * 365 * 86400))


class Store:
    """The history store's reading side (``evalq.results.history.HistoryStore``), from rows."""

    def __init__(self, runs=None, error: Exception | None = None):
        self.runs, self.error = runs or [], error  # oldest first

    def latest(self, status=None):
        if self.error:
            raise self.error
        return list({run["suite"]: run for run in self.runs if status in (None, run["status"])}.values())


def unreachable() -> redis.Redis:
    # a port just freed: nothing listens there
    return redis.Redis(port=free_port(), socket_connect_timeout=0.2, socket_timeout=0.2, retry=Retry(NoBackoff(), 0))


def test_a_scrape_yields_what_it_can_and_logs_a_failure_once(caplog):
    row = {"suite": "nightly", "job_id": "j1", "status": "done", "finished_at": "2026-01-02T03:04:05+00:00",
           "cost": 1.25, "metrics": [{"metric": "rouge", "name": "rouge", "field": "rouge1", "value": 0.5,
                                      "ci95": None, "n": 3}], "regressions": [{"metric": "rouge"}]}
    collector = JobsCollector(unreachable(), stall_seconds=900, open_store=lambda: Store([row]))
    with caplog.at_level(logging.WARNING, logger="evalq.metrics"):
        first = {f.name: f for f in collector.collect()}
        second = {f.name: f for f in collector.collect()}
    assert set(first) == set(second) == {"evalq_suite_value", "evalq_suite_regressions",
                                         "evalq_suite_last_run_timestamp_seconds", "evalq_suite_cost",
                                         "evalq_suite_series_omitted"}
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 2 and any("jobs" in m for m in logged) and any("backlog" in m for m in logged)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in first.values() for s in f.samples}
    assert samples[("evalq_suite_value", (("field", "rouge1"), ("metric", "rouge"), ("name", "rouge"),
                                          ("suite", "nightly"), ("tenant", "")))] == 0.5
    assert samples[("evalq_suite_regressions", (("suite", "nightly"), ("tenant", "")))] == 1
    assert samples[("evalq_suite_last_run_timestamp_seconds", (("status", "done"), ("suite", "nightly"), ("tenant", "")))] \
        == 1767323045.0
    assert samples[("evalq_suite_cost", (("suite", "nightly"), ("tenant", "")))] == 1.25


def test_a_failing_history_store_leaves_the_redis_gauges(caplog):
    collector = JobsCollector(unreachable(), open_store=lambda: Store(error=RuntimeError("database is locked")))
    with caplog.at_level(logging.WARNING, logger="evalq.metrics"):
        assert list(collector.collect()) == []
    assert "history left out of the scrape: RuntimeError: database is locked" in caplog.text


def run_row(suite, status, value, finished_at, cost=None, regressions=()):
    return {"suite": suite, "job_id": f"{suite}-{finished_at}", "status": status, "finished_at": finished_at,
            "cost": cost, "metrics": [{"metric": "f1_score", "name": "f1", "field": "mean", "value": value}],
            "regressions": list(regressions)}


def test_values_are_the_last_done_runs_and_the_time_the_last_runs():
    store = Store([run_row("a", "done", 0.7, "2026-01-01T00:00:00+00:00", regressions=[{"metric": "f1_score"}]),
                   run_row("a", "failed", None, "2026-01-02T00:00:00+00:00", cost=0.5),
                   run_row("b", "cancelled", 0.1, "2026-01-03T00:00:00+00:00")])
    families = {f.name: f for f in JobsCollector(unreachable(), open_store=lambda: store).collect()}
    samples = {(f.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    value = [(labels, v) for (name, labels), v in samples.items() if name == "evalq_suite_value"]
    assert value == [((("field", "mean"), ("metric", "f1_score"), ("name", "f1"), ("suite", "a"), ("tenant", "")), 0.7)]
    assert samples[("evalq_suite_regressions", (("suite", "a"), ("tenant", "")))] == 1  # of the done run
    assert ("evalq_suite_regressions", (("suite", "b"), ("tenant", ""))) not in samples  # b never ran to the end
    stamps = {labels: v for (name, labels), v in samples.items() if name == "evalq_suite_last_run_timestamp_seconds"}
    assert stamps == {(("status", "failed"), ("suite", "a"), ("tenant", "")): 1767312000.0,
                      (("status", "cancelled"), ("suite", "b"), ("tenant", "")): 1767398400.0}
    assert samples[("evalq_suite_cost", (("suite", "a"), ("tenant", "")))] == 0.5


def test_suite_rows_skip_missing_values_and_costs():
    rows = suite_rows([{"suite": "s", "status": "done", "finished_at": None, "cost": None,
                        "metrics": [{"metric": "m", "name": "m", "field": "mean", "value": None}],
                        "regressions": []}])
    assert rows == {"value": [], "regressions": [(("s", ""), 0.0)], "last_run_timestamp_seconds": [], "cost": [],
                    "series_omitted": [((), 0.0)]}


def test_suite_series_are_bounded():
    """Before: 5 messages of 100 entries gave 503 series, one 2,000-entry message 2,503, kept for ever.
    Now: the most recent suites only, none older than the age bound, and so many values per suite."""
    day = 86400.0
    now = 1_800_000_000.0

    def row(suite: str, ended_days_ago: float, entries: int) -> dict:
        at = datetime.fromtimestamp(now - ended_days_ago * day, timezone.utc).isoformat()
        return {"suite": suite, "status": "done", "finished_at": at, "cost": 1.0, "regressions": [],
                "metrics": [{"metric": "m", "name": f"e{k}", "field": "mean", "value": 0.5} for k in range(entries)]}

    latest = [row(f"s{k}", k, 100) for k in range(5)] + [row("big", 0.5, 2000), row("stale", 40, 3)]
    rows = suite_rows(latest, bounds=SuiteBounds(max_suites=4, max_age=30 * day, max_values=50), now=now)
    kept = {labels[0] for labels, _ in rows["regressions"]}
    assert kept == {"s0", "big", "s1", "s2"}  # the four most recent; s3, s4 and the stale one are out
    assert len(rows["value"]) == 4 * 50 and len(rows["cost"]) == 4 == len(rows["last_run_timestamp_seconds"])
    assert rows["series_omitted"] == [((), 3 + 3 * 50 + 1950)]  # 3 suites, and the values past 50 of the kept


def test_a_suite_is_its_tenants_in_the_gauges():
    """Before: a forged run in another team's suite set its evalq_suite_value. Two tenants' runs of
    one suite name are two series now, each with its tenant."""
    rows = [{"suite": "rag-nightly", "tenant": tenant, "status": "done", "finished_at": None, "cost": None,
             "regressions": [], "metrics": [{"metric": "exact_match", "name": "exact_match", "field": "mean",
                                             "value": value}]} for tenant, value in (("search", 0.9), ("ads", 0.0))]
    values = suite_rows(rows)["value"]
    assert sorted(values) == [(("rag-nightly", "ads", "exact_match", "exact_match", "mean"), 0.0),
                              (("rag-nightly", "search", "exact_match", "exact_match", "mean"), 0.9)]


def test_a_killed_nodes_directory_goes_when_the_next_node_starts(tmp_path):
    import socket

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    prefix = f"evalq-metrics-{socket.gethostname()}-"
    stale, live = tmp_path / f"{prefix}{dead.pid}-abc", tmp_path / f"{prefix}{os.getpid()}-def"
    for path in (stale, live):
        path.mkdir()
        (path / "counter_1.db").write_bytes(b"\0" * 8)
    done = python("from evalq.shared.cluster import telemetry; print(telemetry.prepare())",
                  {"EVALQ_METRICS_PORT": "9999", "TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    made = Path(done.stdout.strip())
    assert made.parent == tmp_path and not made.exists()  # its own: removed at its exit
    assert not stale.exists() and live.exists()
