"""One reading of item results, by the entry's aggregation kind: what the aggregate counts,
what compare pairs and what the report ranks agree."""

from __future__ import annotations

import json

import pytest

from evalq.shared.scores.aggregate import aggregator_for
from evalq.shared.scores.results import read


@pytest.mark.parametrize("kind,params,record,values,passes", [
    ("mean", {}, {"result": 0.25}, {"mean": 0.25}, None),
    ("mean", {}, {"result": True}, {"mean": 1.0}, None),
    ("mean", {}, {"result": {"f1": 0.5, "precision": 1, "exact": False}},
     {"f1": 0.5, "precision": 1.0, "exact": 0.0}, None),
    ("distribution", {}, {"result": {"f1": 0.9, "layers": [0.1, 0.2]}}, {"f1": 0.9}, None),
    ("rating", {"threshold": 4}, {"result": {"score": 3, "reason": "r"}}, {"mean": 3.0}, False),
    ("rating", {}, {"result": {"score": 5, "reason": "r"}}, {"mean": 5.0}, None),
    ("defect", {"threshold": 4}, {"result": {"severity": 5, "reason": "r"}}, {"defect_rate": 1.0}, False),
    ("defect", {"threshold": 4}, {"result": {"violence": {"severity": 1}, "sexual": {"severity": 0}}},
     {"defect_rate": 0.0}, True),
    ("defect", {}, {"result": {"protected_material": True, "reason": "r"}}, {"defect_rate": 1.0}, False),
    ("mean", {}, {"error": "boom"}, {}, None),
])
def test_each_kind_reads_one_way(kind, params, record, values, passes):
    reading = read(kind, params, record)
    assert reading.values == values and reading.passes is passes
    if "error" in record:
        assert reading.badness == float("inf")


def test_a_boolean_metric_has_the_same_mean_in_results_and_in_compare(tmp_path):
    """Before: a metric returning a bool got ``score: null`` in results.json but a mean in compare."""
    from evalq.cli.compare import load_run, summary

    records = [{"instance_id": f"i{n}", "result": n % 3 == 0} for n in range(9)]
    agg = aggregator_for("mean")
    for record in records:
        agg.add(record)
    assert agg.score() == pytest.approx(3 / 9)
    lo, hi = agg.intervals()
    assert 0 <= lo <= 3 / 9 <= hi <= 1  # 0/1 values: a Wilson interval, inside [0, 1]
    (tmp_path / "results.json").write_text(json.dumps([{"metric": "exact_match", "parameters": {},
                                                        "score": agg.score(), "n": 9}]))
    (tmp_path / "log.jsonl").write_text("".join(json.dumps({**r, "metric": "exact_match", "entry": 0}) + "\n"
                                                for r in records))
    run = load_run(str(tmp_path))
    assert summary(run, "exact_match", "mean")["value"] == pytest.approx(agg.score())
