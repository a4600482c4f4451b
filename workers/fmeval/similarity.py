"""BERTScore as fmeval's algorithms use it: the F1 of an output against each of several
texts, best taken (fmeval's ``BertscoreHelperModel``: HF evaluate's bertscore, one pair at a
time). Here every pair of a chunk goes through one batched bert-score pass."""

from __future__ import annotations

from typing import Any


def best_bertscore(pairs: list[tuple[str, list[str]]], params: Any) -> list[float | None]:
    """For each (output, texts): the best BERTScore F1 of the output against the texts.
    ``params``: fmeval parameters with ``model_type_for_bertscore``."""
    from evalq.workers.metrics.bertscore.metric import bertscore

    instances = [{"actual-output": output, "expected-output": texts} for output, texts in pairs]
    return [r["f1"] for r in bertscore(instances, params.bertscore_params())]


def warm(params: Any) -> str:
    """The registry's ``warm`` hook of fmeval's entries with a bertscore part: its model loaded."""
    if not getattr(params, "bertscore", False):
        return "nothing (bertscore: false)"
    from evalq.workers.metrics.bertscore.metric import warm as warm_bertscore

    return warm_bertscore(params.bertscore_params())
