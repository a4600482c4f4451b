from __future__ import annotations

import json

import pytest

import evalq.shared.job.catalogue  # noqa: F401
from evalq.shared.scores.aggregate import MeanAggregator
from evalq.shared.metrics.params import NoParams
from evalq.shared.metrics.registry import REGISTRY, MetricSpec, Registry, UnknownMetric


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
    # bertscore's: quantiles and histograms need every value, which each part carries packed
    ("distribution", {}, [0.5, 1, 0.25, 0.0, 1.0, 0.75, 0.3]),
    ("distribution", {}, [{"f1": 0.1 * i + 0.01, "precision": None if i == 2 else 0.9 - 0.1 * i,
                           "layers": [0.3 * i, 1 / (i + 3)]} for i in range(7)]),
])
def test_chunk_parts_merge_to_the_streaming_aggregate(kind, params, results):
    from evalq.shared.scores.aggregate import aggregator_for, chunk_part, merge_parts

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


def test_a_distribution_part_carries_its_values_exactly():
    from evalq.shared.scores.aggregate import chunk_part, merge_parts

    values = [1 / 3, 0.1 + 0.2, 2.5e-17, -0.0, 0.987654321]
    part = json.loads(json.dumps(chunk_part("distribution", {}, [{"result": {"f1": v}} for v in values])))
    merged, _, _ = merge_parts("distribution", {}, [part])
    assert list(merged._values["f1"][0]) == values
    assert merged.score()["distribution"]["f1"]["max"] == 0.987654321


def _severity(k: int, category: str | None = None) -> dict:
    rec = {"result": {"severity": k, "label": "x", "reason": "r"}}
    return {**rec, "category": category} if category else rec


def test_defect_rate_of_a_severity_metric_by_hand():
    from evalq.shared.scores.aggregate import DefectAggregator

    agg = DefectAggregator({"threshold": 4})
    severities = [0, 1, 2, 3, 4, 5, 6, 7, 4, 0]
    for k in severities:
        agg.add(_severity(k))
    agg.add({"error": "JudgeError: no reply"})
    agg.add({"skipped": "token cap"})
    score = agg.score()
    from evalq.shared.scores.stats import wilson

    assert score.pop("ci95") == pytest.approx(wilson(5, 10))  # (wilson is checked against the textbook)
    assert score == {"defect_rate": 5 / 10, "n_defects": 5, "mean_severity": sum(severities) / 10,
                     "severity": {"very_low": 3, "low": 2, "medium": 3, "high": 2}, "threshold": 4}
    assert (agg.n, agg.n_errors, agg.n_skipped) == (10, 1, 1)  # errors and skips are not in the denominator


def test_defect_rates_per_harm_any_harm_and_flags_merge_from_parts():
    from evalq.shared.scores.aggregate import DefectAggregator, chunk_part, merge_parts

    items = [{"result": {"violence": {"severity": v}, "sexual": {"severity": s}}} for v, s in
             [(0, 0), (6, 1), (5, 5), (1, 7), (2, 2)]]
    whole = DefectAggregator({"threshold": 5})
    for rec in items:
        whole.add(rec)
    parts = [chunk_part("defect", {"threshold": 5}, items[i:i + 2]) for i in range(0, 5, 2)]
    merged, _, covered = merge_parts("defect", {"threshold": 5}, parts)
    assert covered == 5 and merged.score() == whole.score()
    score = whole.score()
    assert score["violence"]["n_defects"] == 2 and score["violence"]["defect_rate"] == 2 / 5
    assert score["sexual"]["n_defects"] == 2
    assert {k: v for k, v in score["any"].items() if k != "ci95"} == {"defect_rate": 3 / 5, "n_defects": 3}
    flags = DefectAggregator({})
    for value in (True, False, False, True):
        flags.add({"result": {"protected": value, "reason": "r"}})
    assert {k: v for k, v in flags.score().items() if k != "ci95"} == {"defect_rate": 0.5, "n_defects": 2}


# judge score, human grade: a fixed table with ties and disagreements
TABLE = [(5, 5), (4, 5), (3, 3), (2, 4), (1, 1), (5, 4), (3, 2), (4, 4), (2, 2), (1, 3), (5, 5), (3, 3)]


def _textbook_quadratic_kappa(pairs, lo=1, hi=5):
    import numpy as np

    k = hi - lo + 1
    observed = np.zeros((k, k))
    for j, h in pairs:
        observed[j - lo, h - lo] += 1
    expected = np.outer(observed.sum(1), observed.sum(0)) / observed.sum()
    weights = np.array([[(i - j) ** 2 / (k - 1) ** 2 for j in range(k)] for i in range(k)])
    return 1 - (weights * observed).sum() / (weights * expected).sum()


def test_rating_agreement_against_scipy_sklearn_and_the_textbook():
    from scipy.stats import spearmanr
    from sklearn.metrics import cohen_kappa_score

    from evalq.shared.scores.aggregate import Agreement, chunk_part, merge_parts

    records = [{"result": {"score": j, "reason": "r"}, "human": h} for j, h in TABLE]
    records.append({"result": {"score": 3, "reason": "r"}})  # no human grade: not a pair
    records.append({"error": "JudgeError: x", "human": 4})  # no judge score: not a pair
    agreement = Agreement("rating", {})
    for rec in records:
        agreement.add(rec)
    got = agreement.result()
    judge, human = [j for j, _ in TABLE], [h for _, h in TABLE]
    assert got["n"] == len(TABLE)
    assert got["exact"] == pytest.approx(sum(j == h for j, h in TABLE) / len(TABLE))
    assert got["within_1"] == pytest.approx(sum(abs(j - h) <= 1 for j, h in TABLE) / len(TABLE))
    assert got["kappa_quadratic"] == pytest.approx(cohen_kappa_score(judge, human, weights="quadratic"))
    assert got["kappa_quadratic"] == pytest.approx(_textbook_quadratic_kappa(TABLE))
    assert got["spearman"] == pytest.approx(spearmanr(judge, human).statistic)
    # per chunk, merged: the same numbers
    merged = Agreement("rating", {})
    merge_parts("rating", {}, [chunk_part("rating", {}, records[i:i + 5]) for i in range(0, len(records), 5)],
                merged)
    assert merged.result() == pytest.approx(got)


def test_defect_agreement_is_precision_and_recall_against_human_labels():
    from evalq.shared.scores.aggregate import Agreement

    # judge severity, human label (a severity, or true/false); threshold 4
    rows = [(6, True), (5, 2), (1, False), (4, 7), (0, 5), (2, False), (7, False), (3, 1)]
    agreement = Agreement("defect", {"threshold": 4})
    for severity, label in rows:
        agreement.add({"result": {"severity": severity, "label": "x", "reason": "r"}, "human": label})
    judge = [s >= 4 for s, _ in rows]
    human = [lab if isinstance(lab, bool) else lab >= 4 for _, lab in rows]
    tp = sum(j and h for j, h in zip(judge, human))
    assert agreement.result() == {"n": 8, "precision": tp / sum(judge), "recall": tp / sum(human),
                                  "exact": sum(j == h for j, h in zip(judge, human)) / 8}


def test_mean_intervals_match_the_normal_approximation_and_merge():
    import numpy as np

    from evalq.shared.scores.aggregate import MeanAggregator, chunk_part, merge_parts

    values = [0.1, 0.4, 0.35, 0.8, 0.9, 0.05, 0.6, 0.55]
    records = [{"result": v} for v in values] + [{"result": {"x": v}} for v in []]
    agg = MeanAggregator()
    for rec in records:
        agg.add(rec)
    x = np.array(values)
    half = 1.959963984540054 * x.std(ddof=1) / np.sqrt(len(x))
    assert agg.intervals() == pytest.approx([x.mean() - half, x.mean() + half])
    merged, _, _ = merge_parts("mean", {}, [chunk_part("mean", {}, records[:3]), chunk_part("mean", {}, records[3:])])
    assert merged.intervals() == pytest.approx(agg.intervals())


def test_cpu_chunks_are_sized_by_the_entry_and_fixed_sizes_stay():
    from evalq.orchestrator.submit import job_spec
    from evalq.shared.job.schema import parse_job
    from evalq.shared.metrics.registry import REGISTRY, device_chunk, sized_chunk

    assert REGISTRY.get("bleu").chunk_size is None and REGISTRY.get("coherence").chunk_size == 4
    assert [sized_chunk(n) for n in (1, 25_000, 50_000, 99_999, 100_000, 10**7)] == [250, 250, 500, 1000, 1000, 1000]
    assert [device_chunk(n, 512, 4096) for n in (1, 4096, 4097, 20_000, 10**7)] == [512, 512, 1024, 2560, 4096]
    assert REGISTRY.get("bertscore").device_chunk == (512, 4096)

    def sizes(n: int, chunk_size: int | None = None) -> dict[str, int]:
        job = parse_job({"instances": [{"id": str(i), "actual-output": "a", "expected-output": ["a"]}
                                       for i in range(n)],
                         "metrics": [{"id": "bleu"}, {"id": "bertscore"}]})
        return {e["id"]: e["chunk_size"] for e in job_spec(job, chunk_size)["metrics"].values()}

    assert sizes(300) == {"bleu": 250, "bertscore": 512}
    # a device metric: an eighth of the entry per task, in multiples of 512, from 512 to 4,096
    assert sizes(20_000) == {"bleu": 250, "bertscore": 2560}
    assert sizes(60_000) == {"bleu": 600, "bertscore": 4096}
    assert sizes(300, chunk_size=7) == {"bleu": 7, "bertscore": 7}  # --chunk-size wins


def test_cheap_metrics_chunks_hold_work_enough_and_groups_keep_one_size(monkeypatch):
    """exact_match costs about 13 us an item against about 8 ms a task: its chunks are sized by
    their work; entries scored together are sized by their summed costs, and not at all when one
    of them is not cheap; a job's chunk_size still wins."""
    import math

    from evalq.orchestrator.submit import job_spec, outline
    from evalq.shared.job.schema import parse_job
    from evalq.shared.metrics.registry import CHEAP_CHUNK_BYTES, CHEAP_CHUNK_MAX, CHEAP_CHUNK_S, REGISTRY, sized_chunk

    em, f1 = REGISTRY.get("exact_match").item_us, REGISTRY.get("f1_score").item_us
    assert em and f1 and REGISTRY.get("bleu").item_us is None
    by_work = math.ceil(CHEAP_CHUNK_S * 1e6 / em)
    assert 1000 < by_work < CHEAP_CHUNK_MAX
    assert sized_chunk(100_000, em) == by_work
    assert sized_chunk(20_000, em) == 2500  # an eighth of the entry: it still spreads over workers
    assert sized_chunk(1000, em) == sized_chunk(1000) == 250  # small entries as before
    assert sized_chunk(10**7, 0.001) == CHEAP_CHUNK_MAX

    def entries(n: int, ids: list[str], chunk_size: int | None = None) -> dict[str, dict]:
        job = parse_job({"instances": [{"id": str(i), "actual-output": "a", "expected-output": ["a"]}
                                       for i in range(n)], "metrics": [{"id": i} for i in ids]})
        spec = job_spec(job, chunk_size)["metrics"]
        assert {k: e["chunk_size"] for k, e in outline(job, chunk_size)["metrics"].items()} == \
            {k: e["chunk_size"] for k, e in spec.items()}  # `evalq validate` shows the plan it will be
        return {e["id"]: e for e in spec.values()}

    alone = entries(100_000, ["exact_match"])
    assert alone["exact_match"]["chunk_size"] == by_work
    together = entries(100_000, ["exact_match", "f1_score"])
    assert {e["chunk_size"] for e in together.values()} == {math.ceil(CHEAP_CHUNK_S * 1e6 / (em + f1))}
    assert together["f1_score"]["led_by"] == "exact_match@0"  # still read once for both
    with_bleu = entries(100_000, ["exact_match", "bleu"])
    assert {e["chunk_size"] for e in with_bleu.values()} == {1000} and with_bleu["bleu"]["led_by"]
    assert entries(100_000, ["exact_match"], chunk_size=300)["exact_match"]["chunk_size"] == 300
    # long texts: no more of them in a chunk than CHEAP_CHUNK_BYTES (nor fewer than a 1,000-item chunk)
    assert sized_chunk(100_000, em, 2048) == CHEAP_CHUNK_BYTES // 2048 < by_work
    assert sized_chunk(100_000, em, CHEAP_CHUNK_BYTES // 10) == 1000
    job = parse_job({"instances": [{"id": str(i), "actual-output": "a" * 3000, "expected-output": ["b"]}
                                   for i in range(100_000)], "metrics": [{"id": "exact_match"}]})
    size = job_spec(job)["metrics"]["exact_match@0"]["chunk_size"]  # instances of ~3,050 bytes stored
    assert 1000 < size < by_work and size * 3000 <= CHEAP_CHUNK_BYTES < (size + 1) * 3100
    monkeypatch.setenv("EVALQ_GROUP_ENTRIES", "0")  # each entry on its own: each by its own cost
    apart = entries(100_000, ["exact_match", "bleu"])
    assert apart["exact_match"]["chunk_size"] == by_work and apart["bleu"]["chunk_size"] == 1000


def _wilson_textbook(k: int, n: int) -> list[float]:
    """Wilson score interval from its formula (Wilson 1927), z from scipy."""
    from scipy.stats import norm

    z, p = norm.ppf(0.975), k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5
    return [centre - half, centre + half]


def test_a_0_1_metric_gets_the_wilson_interval_merged_from_its_chunks():
    from evalq.shared.scores.aggregate import chunk_part, merge_parts

    # issue 21: exact_match at 0.10 over 30 items was [-0.0092, 0.2092] (normal interval)
    records = [{"result": int(i < 3)} for i in range(30)]
    parts = [chunk_part("mean", {}, records[i:i + 7]) for i in range(0, 30, 7)]
    merged, _, _ = merge_parts("mean", {}, parts)
    spec = REGISTRY.get("exact_match")
    assert merged.intervals(spec.bounds) == pytest.approx(_wilson_textbook(3, 30))
    assert merged.intervals() == pytest.approx(_wilson_textbook(3, 30))  # 0/1 values: Wilson, declared or not
    # all zeros: a real interval, not [0, 0]
    zeros, _, _ = merge_parts("mean", {}, [chunk_part("mean", {}, [{"result": 0}] * 12)])
    assert zeros.intervals() == pytest.approx(_wilson_textbook(0, 12))


@pytest.mark.parametrize("metric_id,result", [
    ("bleu", lambda i: 0.9 if i == 0 else 0.0),
    ("f1_score", lambda i: {"f1": 1.0 if i else 0.6, "precision": 0.02 if i == 0 else 0.0}),
    ("rouge", lambda i: {"rouge1": 0.97 + 0.03 * (i % 2)}),
])
def test_a_bounded_score_interval_stays_in_its_range(metric_id, result):
    from evalq.shared.scores.aggregate import chunk_part, merge_parts

    spec = REGISTRY.get(metric_id)
    lo, hi = spec.bounds
    records = [{"result": result(i)} for i in range(10)]
    merged, _, _ = merge_parts(spec.aggregation, {}, [chunk_part(spec.aggregation, {}, records)])
    cis = merged.intervals(spec.bounds)
    for ci in (cis.values() if isinstance(cis, dict) else [cis]):
        assert lo <= ci[0] <= ci[1] <= hi


def test_a_rating_interval_stays_on_its_scale():
    from evalq.shared.scores.aggregate import RatingAggregator

    agg = RatingAggregator({"scale_min": 1, "scale_max": 5})
    for k in [5] * 9 + [4]:
        agg.add({"result": {"score": k, "reason": ""}})
    lo, hi = agg.score()["ci95"]
    assert 1 <= lo <= hi <= 5
    binary = RatingAggregator({"scale_min": 0, "scale_max": 1})
    for k in [1] * 27 + [0] * 3:
        binary.add({"result": {"score": k, "reason": ""}})
    assert binary.score()["ci95"] == pytest.approx(_wilson_textbook(27, 30))
