"""classification_accuracy against fmeval 1.2.3: its converter and per-item score, and its
dataset-level scores (sklearn's) from evalq's aggregation merged over chunks and categories."""

from __future__ import annotations

import random

import pytest

import evalq.shared.job.catalogue  # noqa: F401
from evalq.shared.scores.aggregate import chunk_part, merge_parts
from evalq.shared.fmeval.classification import valid_labels
from evalq.shared.fmeval.params import ClassificationAccuracyParams
from evalq.workers.fmeval.classification import classification_accuracy

OUTPUTS = ["The answer is 1", "0", "1 or 0", "I think 2.", "2", "positive", "Unknown", "1 1", "", "0 because",
           "Positive", "no idea", "It is 2", "1"]
TARGETS = ["1", "0", "1", "2", "2", "1", "0", "1", "0", "0", "positive", "2", "2", "Positive"]


def items(labels=None):
    instances = [{"id": str(i), "actual-output": o, "expected-output": [t]} for i, (o, t) in enumerate(zip(OUTPUTS,
                                                                                                           TARGETS))]
    params = ClassificationAccuracyParams(valid_labels=labels)
    prepared = valid_labels(instances, params)
    return instances, params, prepared


@pytest.mark.parametrize("labels", [None, ["0", "1", "2"], ["1", "2", "POSITIVE"]])
@pytest.mark.parametrize("average", ["micro", "macro", "weighted"])
def test_items_and_dataset_scores_equal_fmeval(fmeval, labels, average):
    instances, params, prepared = items(labels)
    params = params.model_copy(update={"multiclass_average_strategy": average})
    [expected] = fmeval("classification", [{"outputs": OUTPUTS, "targets": TARGETS, "valid_labels": labels,
                                            "average": average}])
    results = [classification_accuracy(inst, params, prepared) for inst in instances]
    assert [r["classified_model_output"] for r in results] == expected["predicted"]
    assert [r["classification_accuracy_score"] for r in results] == expected["items"]

    records = [{"instance_id": str(i), "result": r} for i, r in enumerate(results)]
    random.Random(7).shuffle(records)
    dumped = params.model_dump(mode="json")
    parts = [chunk_part("classification", dumped, records[i:i + 4]) for i in range(0, len(records), 4)]
    overall, _, covered = merge_parts("classification", dumped, parts)
    assert covered == len(records)
    score = overall.score()
    assert score["classification_accuracy_score"] == pytest.approx(sum(expected["items"]) / len(records))
    for name, value in expected["dataset"].items():
        assert score[name] == pytest.approx(value, abs=1e-12), name


def test_per_category_scores_are_each_categorys_own(fmeval):
    instances, params, prepared = items()
    results = [classification_accuracy(inst, params, prepared) for inst in instances]
    records = [{"instance_id": str(i), "category": "a" if i % 2 else "b", "result": r} for i, r in enumerate(results)]
    _, by_category, _ = merge_parts("classification", params.model_dump(mode="json"),
                                    [chunk_part("classification", params.model_dump(mode="json"), records)])
    for category, parity in (("a", 1), ("b", 0)):
        picked = [i for i in range(len(OUTPUTS)) if i % 2 == parity]
        [expected] = fmeval("classification", [{"outputs": [OUTPUTS[i] for i in picked],
                                                "targets": [TARGETS[i] for i in picked],
                                                "valid_labels": prepared["labels"], "average": "micro"}])
        for name, value in expected["dataset"].items():
            assert by_category[category].score()[name] == pytest.approx(value, abs=1e-12)


def test_an_error_item_is_counted_apart_and_not_in_the_confusion():
    params = ClassificationAccuracyParams()
    records = [{"instance_id": "1", "result": {"classification_accuracy_score": 1, "classified_model_output": "1",
                                               "target_output": "1"}},
               {"instance_id": "2", "error": "MetricError: boom"}]
    overall, _, _ = merge_parts("classification", params.model_dump(mode="json"),
                                [chunk_part("classification", params.model_dump(mode="json"), records)])
    assert overall.n == 1 and overall.n_errors == 1
    assert overall.score()["balanced_accuracy_score"] == 1.0
