"""fmeval's classification accuracy: the converter (an output to a label), the job's label
set, and the dataset-level scores, which are not means of items: ``balanced_accuracy_score``,
``precision_score`` and ``recall_score`` (sklearn's, with ``multiclass_average_strategy``) come
from the confusion counts of every item, kept per chunk and merged (``ClassificationAggregator``).
"""

from __future__ import annotations

from typing import Any

from evalq.shared.scores.aggregate import MeanAggregator, register_aggregator

UNKNOWN_LABEL = "unknown"  # fmeval's label for an output that names no valid label
POSITIVE_LABEL = "1"       # the positive class of the ``binary`` average


def convert(output: str, valid_labels: list[str]) -> str:
    """fmeval's ``convert_model_output_to_label``: the first word of the output (split on
    spaces, each lower-cased and stripped) that is a valid label (lower-cased, stripped)."""
    valid = {label.lower().strip() for label in valid_labels}
    for word in output.split(" "):
        if word.lower().strip() in valid:
            return word.lower().strip()
    return UNKNOWN_LABEL


def valid_labels(instances: list[dict], params) -> dict:
    """The registry's ``prepare`` hook: the job's labels, ``valid_labels`` or else, as fmeval
    takes them, every distinct target (each instance's first reference)."""
    if params.valid_labels:
        return {"labels": list(params.valid_labels)}
    seen: dict[str, None] = {}
    for inst in instances:
        refs = inst.get("expected-output") or []
        if refs:
            seen.setdefault(refs[0], None)
    return {"labels": list(seen)}


def robustness_labels(instances: list[dict], params) -> dict | None:
    """semantic_robustness's ``prepare``: the labels, for its classification task only."""
    return valid_labels(instances, params) if params.task == "classification" else None


def dataset_scores(confusion: dict[tuple[str, str], int], average: str) -> dict[str, float]:
    """sklearn's balanced_accuracy_score, precision_score and recall_score (``average``; no
    division warnings: an undefined ratio is 0, as sklearn's default zero_division gives it)
    from (true label, predicted label) counts."""
    labels = sorted({t for t, _ in confusion} | {p for _, p in confusion})
    tp = {c: confusion.get((c, c), 0) for c in labels}
    predicted = {c: sum(n for (_, p), n in confusion.items() if p == c) for c in labels}
    true = {c: sum(n for (t, _), n in confusion.items() if t == c) for c in labels}
    total = sum(confusion.values())

    def ratio(a: float, b: float) -> float:
        return a / b if b else 0.0

    per_precision = {c: ratio(tp[c], predicted[c]) for c in labels}
    per_recall = {c: ratio(tp[c], true[c]) for c in labels}
    if average == "micro":
        precision = recall = ratio(sum(tp.values()), total)
    elif average == "macro":
        precision, recall = (ratio(sum(v.values()), len(labels)) for v in (per_precision, per_recall))
    elif average == "weighted":
        support = sum(true.values())
        precision = ratio(sum(true[c] * per_precision[c] for c in labels), support)
        recall = ratio(sum(true[c] * per_recall[c] for c in labels), support)
    else:  # binary: the positive label "1"
        precision, recall = per_precision.get(POSITIVE_LABEL, 0.0), per_recall.get(POSITIVE_LABEL, 0.0)
    present = [c for c in labels if true[c]]
    balanced = ratio(sum(per_recall[c] for c in present), len(present))
    return {"balanced_accuracy_score": balanced, "precision_score": precision, "recall_score": recall}


class ClassificationAggregator(MeanAggregator):
    """The items' mean ``classification_accuracy_score``, and the dataset-level scores from the
    confusion counts. Mergeable: a chunk's part carries its counts."""

    def __init__(self, params: dict | None = None) -> None:
        super().__init__(params)
        self.confusion: dict[tuple[str, str], int] = {}

    def add(self, record: dict[str, Any]) -> None:
        super().add(record)
        result = record.get("result") if record.get("error") is None else None
        if isinstance(result, dict) and "classified_model_output" in result:
            pair = (str(result["target_output"]), str(result["classified_model_output"]))
            self.confusion[pair] = self.confusion.get(pair, 0) + 1

    def state(self) -> dict[str, Any]:
        return {**super().state(), "confusion": [[t, p, n] for (t, p), n in sorted(self.confusion.items())]}

    def merge(self, state: dict[str, Any]) -> None:
        super().merge(state)
        for t, p, n in state.get("confusion", []):
            self.confusion[(t, p)] = self.confusion.get((t, p), 0) + n

    def score(self) -> dict[str, Any] | None:
        means = super().score()
        if means is None or not self.confusion:
            return means
        return {**means, **dataset_scores(self.confusion, self.params.get("multiclass_average_strategy", "micro"))}


register_aggregator("classification", ClassificationAggregator)

