"""Issue 61: a panel of judges. How members' scores combine (a strict majority or the stated
outcome when there is none), and what the rating aggregate says of the panel: each member's mean,
Krippendorff's alpha (equal to the ``krippendorff`` package's on the same table, merged from parts
as computed at once) and the effective number of independent votes."""

from __future__ import annotations

import random

import pytest

import evalq.shared.job.catalogue  # noqa: F401  (registers the metrics)
from evalq.shared.core.errors import JobError
from evalq.shared.job.schema import parse_job
from evalq.shared.judging.panel import combine, mean_correlation, ordinal_alpha
from evalq.shared.scores.aggregate import aggregator_for, chunk_part, merge_parts

krippendorff = pytest.importorskip("krippendorff")


def test_members_scores_combine_by_mean_median_or_strict_majority():
    assert combine({"a": 4, "b": 5, "c": 3}, "mean") == (4.0, None)
    assert combine({"a": 4, "b": 5, "c": 1}, "median") == (4.0, None)
    assert combine({"a": 4, "b": 4, "c": 1}, "majority") == (4.0, True)
    # no value held by more than half: the median, and the item says so
    assert combine({"a": 4, "b": 2, "c": 1}, "majority") == (2.0, False)
    assert combine({"a": 4, "b": 4, "c": 2, "d": 2}, "majority") == (3.0, False)


def panel_records(n: int = 300, seed: int = 5):
    """Three members: a truth per item, one member lenient, one noisy, a few failures."""
    rng = random.Random(seed)
    records, table = [], []
    for i in range(n):
        truth = rng.randint(1, 5)
        scores = {"a": truth, "b": min(5, truth + 1), "c": max(1, min(5, truth + rng.choice((-1, 0, 0, 1))))}
        members = {k: {"score": v, "reason": "r"} for k, v in scores.items()}
        if i % 37 == 0:
            members["c"] = {"error": "JudgeError: timeout"}
            del scores["c"]
        value, _ = combine(scores, "median")
        records.append({"instance_id": f"i{i}", "result": {"score": int(value) if value.is_integer() else value,
                                                           "reason": "r", "members": members, "panel": "median"}})
        table.append([scores.get(k, float("nan")) for k in ("a", "b", "c")])
    return records, table


def test_the_panels_worth_merged_from_parts_equals_the_reference_libraries():
    import numpy as np

    records, table = panel_records()
    parts = [chunk_part("rating", {"threshold": 4}, records[k:k + 4]) for k in range(0, len(records), 4)]
    merged, _, _ = merge_parts("rating", {"threshold": 4}, parts)
    direct = aggregator_for("rating", {"threshold": 4})
    for r in records:
        direct.add(r)
    got = merged.score()
    assert got == direct.score()
    panel = got["panel"]
    data = np.array(table, dtype=float).T  # raters x units
    assert panel["alpha"] == pytest.approx(krippendorff.alpha(reliability_data=data, level_of_measurement="ordinal"))
    for k, name in enumerate(("a", "b", "c")):
        column = data[k][~np.isnan(data[k])]
        assert panel["members"][name]["mean"] == pytest.approx(column.mean()) and panel["members"][name]["n"] == len(column)
    assert panel["members"]["c"]["failed"] == len(range(0, 300, 37))
    # the effective votes from the members' pairwise correlations (numpy's, over the items both scored)
    rs = []
    for i, j in ((0, 1), (0, 2), (1, 2)):
        both = ~np.isnan(data[i]) & ~np.isnan(data[j])
        rs.append(np.corrcoef(data[i][both], data[j][both])[0, 1])
    assert panel["mean_correlation"] == pytest.approx(np.mean(rs))
    assert panel["effective_votes"] == pytest.approx(3 / (1 + 2 * np.mean(rs)))
    # the panel's mean and pass rate over its items' scores (medians; some between two points)
    scores = [r["result"]["score"] for r in records]
    assert got["mean"] == pytest.approx(np.mean(scores))
    assert got["pass_rate"] == pytest.approx(np.mean([s >= 4 for s in scores]))


def test_copies_of_one_judge_are_one_vote_and_agree_perfectly():
    pairs = {"a|b": [4, 10.0, 10.0, 30.0, 30.0, 30.0]}  # x == y: 1, 2, 3, 4
    assert mean_correlation(pairs) == pytest.approx(1.0)
    assert ordinal_alpha({"1|1": 2.0, "3|3": 2.0, "5|5": 2.0}) == pytest.approx(1.0)
    assert ordinal_alpha({"3|3": 4.0}) is None  # no variation: alpha is undefined


def test_a_panel_is_declared_on_a_rated_entry_with_judges_of_the_job(monkeypatch):
    monkeypatch.setenv("TEST_A_API_KEY", "x")
    judges = {name: {"provider": "openai", "model": name, "api_key_env": "TEST_A_API_KEY",
                     "deployments": [{"region": "lab", "base_url": "http://127.0.0.1:9/v1", "tpm": 1000, "rpm": 10}]}
              for name in ("a", "b")}
    monkeypatch.setenv("EVALQ_ENDPOINTS", "*=http://127.0.0.1:*")
    base = {"instances": [{"id": "1", "input": "q", "actual-output": "x"}], "judges": judges}
    job = parse_job({**base, "metrics": [{"id": "coherence", "parameters": {"judge": ["a", "b"],
                                                                            "panel_aggregate": "majority"}}]})
    [m] = job.metrics
    assert (m.params.judge, m.params.panel, m.params.panel_aggregate) == ("a", ["a", "b"], "majority")
    with pytest.raises(JobError, match="no judge named 'c'"):
        parse_job({**base, "metrics": [{"id": "coherence", "parameters": {"judge": ["a", "c"]}}]})
    with pytest.raises(JobError, match=r"a panel \(a list of judges\) scores the rated quality metrics and rubric"):
        parse_job({**base, "metrics": [{"id": "violence", "parameters": {"judge": ["a", "b"]}}]})
    with pytest.raises(JobError, match="each member once"):
        parse_job({**base, "metrics": [{"id": "coherence", "parameters": {"judge": ["a", "a"]}}]})


def test_the_report_heads_a_panels_entry_with_what_it_is_worth():
    from evalq.results.report import ReportBuilder

    score = {"mean": 3.2, "ci95": [3.0, 3.4], "distribution": {"3": 1},
             "panel": {"members": {"a": {}, "b": {}, "c": {}}, "alpha": 0.817, "effective_votes": 1.05}}
    head = ReportBuilder([], {})._headline({"metric": "coherence", "score": score})
    assert head.startswith("mean 3.2") and "panel of 3, alpha 0.8170, effective votes 1.0500" in head
