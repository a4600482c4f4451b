from __future__ import annotations

import json

import pytest

import evalq.shared.metrics  # noqa: F401
from evalq.shared.aggregate import MeanAggregator
from evalq.shared.params import NoParams
from evalq.shared.registry import REGISTRY, MetricSpec, Registry, UnknownMetric


def test_lookup_miss_suggests_and_lists():
    with pytest.raises(UnknownMetric) as info:
        REGISTRY.get("rogue")
    assert "did you mean 'rouge'?" in str(info.value)
    assert "Available: " in str(info.value) and "bleu" in str(info.value)


def test_duplicate_registration_refused():
    reg = Registry()
    spec = MetricSpec(id="m", params=NoParams, impl="x:y", queue="cpu", description="")
    reg.register(spec)
    with pytest.raises(ValueError, match="already registered"):
        reg.register(spec)


def test_every_builtin_metric_loads_lazily():
    for spec in REGISTRY.all():
        if spec.impl.startswith("evalq.workers."):
            assert callable(spec.load())


def test_mean_of_numbers_ignores_errors():
    agg = MeanAggregator()
    for rec in [{"result": 1.0}, {"result": 0}, {"error": "boom"}, {"result": 0.5}]:
        agg.add(rec)
    assert agg.score() == pytest.approx(0.5)
    assert (agg.n, agg.n_errors) == (3, 1)


def test_mean_of_objects_is_per_key():
    agg = MeanAggregator()
    agg.add({"result": {"f1": 1.0, "precision": 0.5}})
    agg.add({"result": {"f1": 0.0, "precision": 1.0}})
    assert agg.score() == pytest.approx({"f1": 0.5, "precision": 0.75})


def test_no_items_scores_none():
    agg = MeanAggregator()
    agg.add({"error": "x"})
    assert agg.score() is None


@pytest.mark.parametrize("kind,params,results", [
    ("mean", {}, [0.5, 1, 0.25, 0.0, 1.0, 0.75, 0.3]),
    ("mean", {}, [{"f1": 0.5, "precision": 1.0}, {"f1": 0.25, "precision": 0.5}, {"f1": 1.0, "precision": 1.0},
                  {"f1": 0.0, "precision": 0.0}, {"f1": 0.5, "precision": 0.25}, {"f1": 1, "precision": 1},
                  {"f1": 0.2, "precision": 0.1}]),
    ("rating", {"scale_min": 0, "scale_max": 3, "threshold": 2},
     [{"score": s, "reason": "r"} for s in (0, 3, 2, 2, 1, 3, 3)]),
])
def test_chunk_parts_merge_to_the_streaming_aggregate(kind, params, results):
    from evalq.shared.aggregate import aggregator_for, chunk_part, merge_parts

    records = []
    for i, result in enumerate(results):
        record = {"instance_id": str(i), "category": "ab"[i % 2]}
        if i == 3:
            record["error"] = "boom"
        elif i == 5:
            record["skipped"] = "token cap"
        else:
            record["result"] = result
        records.append(record)
    whole, by_category = aggregator_for(kind, params), {}
    for record in records:
        whole.add(record)
        by_category.setdefault(record["category"], aggregator_for(kind, params)).add(record)
    parts = [json.loads(json.dumps(chunk_part(kind, params, records[i:i + 3]))) for i in range(0, len(records), 3)]
    merged, merged_by_category, covered = merge_parts(kind, params, parts)
    assert covered == len(records)
    assert (merged.score(), merged.n, merged.n_errors, merged.n_skipped) == \
        (whole.score(), whole.n, whole.n_errors, whole.n_skipped)
    assert {c: a.score() for c, a in merged_by_category.items()} == {c: a.score() for c, a in by_category.items()}


def test_distribution_is_not_merged_from_parts():
    from evalq.shared.aggregate import chunk_part

    assert chunk_part("distribution", {}, [{"instance_id": "1", "result": 0.5}]) is None
