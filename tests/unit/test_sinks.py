"""The operator's score sinks (issue 60): how they are named, where their credentials come from, and
how what each took is counted in results.json and run.json. The sinks against the real backends:
tests/integration/test_score_sinks.py."""

from __future__ import annotations

import pytest

from evalq.results.sinks import exports_total, named_sink, sinks_for, with_exports
from evalq.shared.core.config import score_sinks, sink_headers
from evalq.shared.core.errors import JobError
from evalq.shared.job.schema import parse_job


def test_sinks_are_named_by_the_operator_with_their_kind(monkeypatch):
    monkeypatch.setenv("EVALQ_SINKS", " phx = phoenix+http://127.0.0.1:6006/ ; ml=MLflow+https://mlflow.acme;"
                                      "broken=http://x;search:phx=phoenix+http://p:1")
    assert score_sinks() == {"phx": ("phoenix", "http://127.0.0.1:6006"), "ml": ("mlflow", "https://mlflow.acme"),
                             "search:phx": ("phoenix", "http://p:1")}
    spec = {"sinks": ["phx", "ml"], "otel_export": False}
    assert [(s.name, s.kind, s.endpoint) for s in sinks_for(spec)] == [
        ("phx", "phoenix", "http://127.0.0.1:6006"), ("ml", "mlflow", "https://mlflow.acme")]
    # a name the operator no longer has, another tenant's: nothing is sent there
    assert named_sink(spec, "gone") is None
    assert named_sink({"scheduling": {"tenant": "ads"}}, "search:phx") is None


def test_credentials_come_from_the_sinks_own_variable(monkeypatch):
    monkeypatch.setenv("EVALQ_SINK_SEARCH_PHX_HEADERS", "Authorization=Bearer%20k-1, x-team = search")
    assert sink_headers("search:phx") == {"authorization": "Bearer k-1", "x-team": "search"}
    assert sink_headers("other") == {}


def test_an_unknown_sink_or_kind_is_a_validation_error(monkeypatch):
    monkeypatch.setenv("EVALQ_SINKS", "phx=phoenix+http://127.0.0.1:1;odd=langfuse+http://127.0.0.1:2")
    traces = [{"id": "s1", "actual-output": "x", "otel": {"trace_id": "a" * 32, "span_id": "b" * 16}}]
    with pytest.raises(JobError, match="output.sinks: no sink named 'nope' \\(the operator's EVALQ_SINKS: odd, phx\\)"):
        parse_job({"instances": traces, "metrics": [{"id": "exact_match"}], "output": {"sinks": ["nope"]}})
    with pytest.raises(JobError, match="sink 'odd' is of kind 'langfuse'; the kinds are mlflow, phoenix"):
        parse_job({"instances": traces, "metrics": [{"id": "exact_match"}], "output": {"sinks": ["odd"]}})


def test_what_each_sink_took_is_counted_per_entry_and_in_total():
    summary = [{"metric": "a"}, {"metric": "b"}]
    runs = [("a@0", {}), ("b@1", {})]
    sinks = {"otlp": {"kind": "otlp", "endpoint": "http://c/v1/logs", "answer": None,
                      "entries": {"a@0": {"sent": 3, "unsent": 0}, "b@1": {"sent": 3, "unsent": 0}}},
             "phx": {"kind": "phoenix", "endpoint": "http://p", "answer": "404 Spans with IDs x do not exist.",
                     "entries": {"a@0": {"sent": 2, "unsent": 1, "refused": 2},
                                 "b@1": {"sent": 1, "unsent": 0, "skipped": 2}}}}
    with_exports(summary, runs, sinks)
    assert summary[0]["exports"]["phx"] == {"kind": "phoenix", "endpoint": "http://p", "sent": 2, "unsent": 1,
                                            "refused": 2, "answer": "404 Spans with IDs x do not exist."}
    assert "answer" not in summary[1]["exports"]["phx"]  # everything it could send was taken
    assert exports_total(summary) == {
        "otlp": {"kind": "otlp", "endpoint": "http://c/v1/logs", "sent": 6, "unsent": 0},
        "phx": {"kind": "phoenix", "endpoint": "http://p", "sent": 3, "unsent": 1, "refused": 2, "skipped": 2,
                "answer": "404 Spans with IDs x do not exist."}}
    assert exports_total([{"metric": "a"}]) is None
