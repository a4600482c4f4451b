"""People's labels (issue 75): a labels file read with clear errors, each label kept once in a real
SQLite history store, and the judge's agreement with people equal to the ``krippendorff`` package's
on the same table (the Phoenix and MLflow paths: tests/integration/test_score_sinks.py)."""

from __future__ import annotations

import json
import random

import krippendorff
import numpy as np
import pytest

from evalq.results.history import open_store
from evalq.results.labels import Label, agreement_of, keep, labels_of, number, read_file
from evalq.shared.core.errors import JobError


def test_agreement_equals_the_krippendorff_package_and_counts_exact_and_within_one():
    rng = random.Random(11)
    judge = [rng.randint(1, 5) for _ in range(60)]
    person = [min(5, max(1, j + rng.choice((-2, -1, 0, 0, 0, 1)))) for j in judge]
    got = agreement_of(list(zip(map(float, judge), map(float, person))))
    expected = krippendorff.alpha(reliability_data=np.array([judge, person], dtype=float),
                                  level_of_measurement="ordinal")
    assert got["alpha"] == pytest.approx(expected)
    assert got["n"] == 60 and got["exact"] == pytest.approx(sum(a == b for a, b in zip(judge, person)) / 60)
    assert got["within_1"] == pytest.approx(sum(abs(a - b) <= 1 for a, b in zip(judge, person)) / 60)
    assert agreement_of([])["alpha"] is None and agreement_of([(3.0, 3.0), (3.0, 3.0)])["alpha"] is None


def test_the_suites_bound_on_agreement_with_people_is_its_own_else_the_operators(monkeypatch):
    from evalq.shared.job.nightly import Regression

    monkeypatch.setenv("EVALQ_LABELS_MIN_ALPHA", "0.5")
    assert Regression().resolved().min_alpha == 0.5 and Regression(min_alpha=0.8).resolved().min_alpha == 0.8
    with pytest.raises(ValueError):
        Regression(min_alpha=2)


def test_a_labels_value_is_a_number_a_verdict_or_nothing():
    assert [number(v) for v in (4, 2.5, True, False, "pass", "FAIL", " 3 ", "yes")] == [4, 2.5, 1, 0, 1, 0, 3, 1]
    assert [number(v) for v in (None, "great", float("nan"), [1], {})] == [None] * 5


def test_a_labels_file_as_jsonl_and_csv_and_its_errors_name_the_line(tmp_path):
    jsonl = tmp_path / "labels.jsonl"
    jsonl.write_text("\n".join(json.dumps(row) for row in [
        {"instance_id": "q1", "name": "coherence", "value": 4, "annotator": "ana", "labelled_at": "2026-11-29T10:00:00Z"},
        {"instance_id": 2, "name": "coherence", "value": "fail", "job_id": "abc"}]) + "\n\n")
    first, second = read_file(jsonl)
    assert (first.instance_id, first.name, first.value, first.annotator, first.source) == ("q1", "coherence", 4, "ana", "file")
    assert first.labelled_at.isoformat() == "2026-11-29T10:00:00" and first.job_id is None
    assert (second.instance_id, second.value, second.annotator, second.job_id) == ("2", 0.0, "file", "abc")
    assert first.source_id != second.source_id and read_file(jsonl)[0].source_id == first.source_id  # stable
    table = tmp_path / "labels.csv"
    table.write_text("instance_id,name,value,annotator\nq1,coherence,5,ben\nq2,coherence,,ben\n")
    with pytest.raises(JobError, match=r"labels.csv line 3: 'value' is missing"):
        read_file(table)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instance_id": "q1", "name": "c", "value": 1}\n{"instance_id": "q2", "name": "c", "value": "great"}\n')
    with pytest.raises(JobError, match=r"bad.jsonl line 2: 'value': expected a number, true/false or pass/fail"):
        read_file(bad)
    bad.write_text("{not json\n")
    with pytest.raises(JobError, match=r"bad.jsonl line 1: not JSON"):
        read_file(bad)


def test_each_label_is_kept_once_and_an_edited_one_updated(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'history.sqlite'}")
    given = [Label(f"q{k}", "coherence", float(k % 5 + 1), "ana", "phoenix", f"a{k}", None, "night1") for k in range(10)]
    assert keep(store.engine, "s", None, given) == {"new": 10, "updated": 0, "unchanged": 0}
    assert keep(store.engine, "s", None, given) == {"new": 0, "updated": 0, "unchanged": 10}
    edited = [*given[:9], Label("q9", "coherence", 1.0, "ana", "phoenix", "a9", None, "night1")]
    assert keep(store.engine, "s", None, edited) == {"new": 0, "updated": 1, "unchanged": 9}
    rows = labels_of(store.engine, "s", "night1")
    assert len(rows) == 10 and {r["instance_id"]: r["value"] for r in rows}["q9"] == 1.0
    assert labels_of(store.engine, "other-suite", "night1") == []
