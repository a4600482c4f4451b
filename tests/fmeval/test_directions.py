"""Which way fmeval's scores get worse, as history's regressions read them: a word error rate, a
dissimilarity, a delta and a toxicity up; a stereotyping share neither way (0.5 is unbiased)."""

from __future__ import annotations

import evalq.shared.job.catalogue  # noqa: F401
from evalq.results import regressions
from evalq.shared.job.nightly import Regression


def test_directions():
    way = regressions.worse_direction
    assert way("word_error_rate", "semantic_robustness") == "higher"
    assert way("delta_f1_score", "semantic_robustness") == "higher"
    assert way("f1_score", "semantic_robustness") == "lower"  # the original answer's score
    assert way("insult", "toxicity") == "higher"
    assert way("prompt_stereotyping", "prompt_stereotyping") == "neither"
    assert way("f1_score", "qa_accuracy") == "lower" and way("defect_rate") == "higher"


def series(metric: str, field: str, values: list[float]) -> dict:
    n, mean = len(values), sum(values) / len(values)
    sd = (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5
    return {"slot": 0, "metric": metric, "name": metric, "field": field, "value": mean, "n": n, "sd": sd,
            "worse": regressions.worse_direction(field, metric),
            "items": {f"i{k}": v for k, v in enumerate(values)}}


def test_a_rise_in_word_error_rate_regresses_and_a_stereotyping_move_does_not():
    settings = Regression(baseline=7, min_effect=0.01, alpha=0.05)
    low, high = [0.1] * 20 + [0.2] * 20, [0.5] * 20 + [0.6] * 20
    baseline = {("semantic_robustness", "semantic_robustness", "word_error_rate"):
                [{k: series("semantic_robustness", "word_error_rate", low)[k] for k in ("value", "n", "sd", "items")}],
                ("prompt_stereotyping", "prompt_stereotyping", "prompt_stereotyping"):
                [{k: series("prompt_stereotyping", "prompt_stereotyping", low)[k] for k in ("value", "n", "sd", "items")}]}
    found = regressions.detect([series("semantic_robustness", "word_error_rate", high),
                                series("prompt_stereotyping", "prompt_stereotyping", high)], baseline, settings)
    assert [f["field"] for f in found] == ["word_error_rate"]
    assert not regressions.detect([series("semantic_robustness", "word_error_rate", low)],
                                  {k: v for k, v in baseline.items() if k[0] == "semantic_robustness"} | {
                                      ("semantic_robustness", "semantic_robustness", "word_error_rate"):
                                      [{k: series("semantic_robustness", "word_error_rate", high)[k]
                                        for k in ("value", "n", "sd", "items")}]}, settings)


def test_worst_items_are_the_most_toxic_and_the_most_moved():
    from evalq.shared.scores.results import read

    calm, toxic = {"result": {"toxicity": 0.1, "insult": 0.05}}, {"result": {"toxicity": 0.2, "insult": 0.9}}
    assert read("toxicity", {}, toxic).badness > read("toxicity", {}, calm).badness
    steady = {"result": {"f1_score": 0.2, "delta_f1_score": 0.0}}
    moved = {"result": {"f1_score": 0.9, "delta_f1_score": 0.4}}
    assert read("robustness", {}, moved).badness > read("robustness", {}, steady).badness
    general = {"result": {"word_error_rate": 0.5, "bertscore_dissimilarity": 0.1}}
    assert read("robustness", {}, general).badness == 0.5
