"""fmeval's classification accuracy per item: the output converted to a label, compared with
the target (the first reference) as fmeval compares them: the converted label is lower-cased,
the target is not. The dataset-level scores are aggregated over all items
(``evalq.shared.fmeval.classification``)."""

from __future__ import annotations

from evalq.shared.core.errors import MetricError
from evalq.shared.fmeval.classification import convert
from evalq.shared.fmeval.params import ClassificationAccuracyParams


def classification_accuracy(instance: dict, params: ClassificationAccuracyParams, prepared: dict) -> dict:
    refs = instance["expected-output"]
    if len(refs) != 1:
        raise MetricError(f"expected one target label, got {len(refs)} references")
    label = convert(instance["actual-output"], prepared["labels"])
    return {"classification_accuracy_score": int(label == refs[0]), "classified_model_output": label,
            "target_output": refs[0]}
