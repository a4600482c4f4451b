from __future__ import annotations

import pytest

import shared.metrics  # noqa: F401
from shared.aggregate import MeanAggregator
from shared.params import NoParams
from shared.registry import REGISTRY, MetricSpec, Registry, UnknownMetric


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
        if spec.impl.startswith("workers."):
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
