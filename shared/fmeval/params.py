"""Parameters of fmeval's algorithms, with fmeval's names and defaults (its ``*Config``
dataclasses), plus what evalq adds to run them offline (``bertscore``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from evalq.shared import bounds
from evalq.shared.params import Params

DEFAULT_DELIMITER = "<OR>"


class Targets(Params):
    target_output_delimiter: str | None = Field(
        default=DEFAULT_DELIMITER, min_length=1, max_length=bounds.MAX_DELIMITER_CHARS,
        description="splits a reference into several acceptable targets (as fmeval's target_output); "
        "null: each reference is one target")


class FactualKnowledgeParams(Targets):
    logical_operator: Literal["OR", "AND"] = Field(
        default="OR", description="OR: correct when the output contains any target (max); AND: all of them (min)")


class BertScored(Params):
    """fmeval's ``model_type_for_bertscore``; evalq computes it with bert-score offline."""

    model_type_for_bertscore: str | None = Field(
        default=None, validate_default=True, max_length=bounds.MAX_PATH_CHARS,
        description="bert-score model (local directory or hub id in the local cache); null: the bundled "
        "all-MiniLM-L6-v2 (fmeval's default, microsoft/deberta-xlarge-mnli, when it is on this machine)")
    bertscore: bool = Field(default=True, description="compute the bertscore score (on the gpu queue); false: "
                            "leave it out, and the entry runs on the cpu queue")

    @field_validator("model_type_for_bertscore")
    @classmethod
    def _model_exists(cls, value, info):
        from evalq.shared.params import BertScoreParams

        BertScoreParams.model_validate({"model_type": value}, context=info.context)
        return value

    def bertscore_params(self):
        from evalq.shared.params import BertScoreParams

        return BertScoreParams(model_type=self.model_type_for_bertscore)


def on_gpu(params: BertScored) -> str:
    """The queue kind of an entry with an optional bertscore part."""
    return "gpu" if params.bertscore else "cpu"


class QAAccuracyParams(Targets, BertScored):
    pass


RougeType = Literal["rouge1", "rouge2", "rougeL"]


class SummarizationAccuracyParams(Targets, BertScored):
    rouge_type: RougeType = Field(default="rouge2", description="the ROUGE variant reported as rouge")
    use_stemmer_for_rouge: bool = Field(default=True, description="Porter-stem tokens before matching")


class ClassificationAccuracyParams(Params):
    valid_labels: list[str] | None = Field(
        default=None, max_length=bounds.MAX_LABELS,
        description="labels the converter looks for in the output; null: every distinct target of the job")
    multiclass_average_strategy: Literal["micro", "macro", "weighted", "binary"] = Field(
        default="micro", description="sklearn's average for precision_score and recall_score (binary: the "
        "positive label is \"1\")")

    @field_validator("valid_labels")
    @classmethod
    def _labels(cls, value):
        if value is not None:
            if not value:
                raise ValueError("must list at least one label")
            if any(len(label) > bounds.MAX_LABEL_CHARS for label in value):
                raise ValueError(f"a label is over {bounds.MAX_LABEL_CHARS} characters")
        return value
