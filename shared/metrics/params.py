"""Typed parameter models, one per metric. ``extra="forbid"``: a misspelt
parameter is an error that names it."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from evalq.shared.core import bounds
from evalq.shared.policy.egress import local_path, request_roots_of
from evalq.shared.core.strict import NoParams, Params, Strict  # noqa: F401  (NoParams: the registry's)


SmoothingName = Literal[
    "method0", "method1", "method2", "method3", "method4", "method5", "method6", "method7"
]


class BleuParams(Params):
    """``nltk.translate.bleu_score.sentence_bleu``'s three parameters."""

    weights: list[float] = Field(
        default=[0.25, 0.25, 0.25, 0.25], max_length=bounds.MAX_BLEU_ORDER,
        description="n-gram weights, one per order (BLEU-4 by default)",
    )
    smoothing_function: SmoothingName = Field(
        default="method0",
        description="nltk SmoothingFunction method by name; method0 is no smoothing",
    )
    auto_reweigh: bool = Field(
        default=False, description="reweigh uniformly when the hypothesis is shorter than the n-gram order"
    )

    @field_validator("weights", mode="before")
    @classmethod
    def _ints_are_floats(cls, value):
        # JSON has one number type: accept [1, 0, 0, 0] under strict mode.
        if isinstance(value, list):
            return [float(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in value]
        return value

    @field_validator("weights")
    @classmethod
    def _valid_weights(cls, value: list[float]) -> list[float]:
        if not value:
            raise ValueError("must list at least one weight")
        if any(w < 0 or not math.isfinite(w) for w in value):
            raise ValueError("weights must be finite and not negative")
        return value


RougeType = Literal[
    "rouge1", "rouge2", "rouge3", "rouge4", "rouge5", "rouge6", "rouge7", "rouge8", "rouge9",
    "rougeL", "rougeLsum",
]


class RougeParams(Params):
    """``rouge_score.rouge_scorer.RougeScorer``'s parameters."""

    rouge_types: list[RougeType] = Field(
        default=["rouge1", "rouge2", "rougeL"], max_length=len(RougeType.__args__),
        description="ROUGE variants to compute, each at most once",
    )
    use_stemmer: bool = Field(default=False, description="Porter-stem tokens before matching")

    @field_validator("rouge_types")
    @classmethod
    def _non_empty_unique(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("must list at least one ROUGE type")
        if len(set(value)) != len(value):
            raise ValueError("lists a ROUGE type twice")
        return value


class BertScoreParams(Params):
    """bert-score's parameters, as Hugging Face evaluate's ``bertscore`` takes them.

    Models load from local files only; the validators check, without importing
    torch, that the model, its layer and any baseline exist on this machine
    (see ``evalq.shared.metrics.bertscore``).
    """

    lang: str | None = Field(
        default=None, max_length=bounds.MAX_LANG_CHARS,
        description="language of the texts (e.g. 'en'); picks bert-score's model for it "
        "when model_type is unset, and its shipped baseline when rescaling")
    model_type: str | None = Field(
        default=None, validate_default=True, max_length=bounds.MAX_PATH_CHARS,
        description="local model directory or hub id in the local Hugging Face cache; unset (and no "
        "lang): the bundled offline sentence-transformers/all-MiniLM-L6-v2")
    num_layers: int | None = Field(
        default=None, ge=0, validate_default=True,
        description="layer whose embeddings are compared; unset: bert-score's tuned layer for the "
        "model (6 for the bundled model)")
    verbose: bool = Field(default=False, description="print bert-score's progress in the worker log")
    idf: bool = Field(default=False, description="weigh tokens by idf over all the job's references")
    device: str | None = Field(
        default=None, pattern=r"^(cpu|cuda(:\d+)?|mps)$", max_length=bounds.MAX_DEVICE_CHARS,
        description="cpu, cuda, cuda:N or mps; unset: cuda when the worker has it, else cpu")
    batch_size: int = Field(default=64, ge=1, le=bounds.MAX_BATCH_SIZE, description="sentences per forward pass")
    nthreads: int = Field(default=4, ge=0, le=bounds.MAX_THREADS,
                          description="accepted for compatibility with HF evaluate; "
                          "evalq computes idf once per job in-process (a forked pool can deadlock)")
    all_layers: bool = Field(default=False, description="return P/R/F1 of every layer (lists)")
    baseline_path: str | None = Field(
        default=None, max_length=bounds.MAX_PATH_CHARS,
        description="baseline CSV (LAYER,P,R,F per layer) for rescale_with_baseline")
    rescale_with_baseline: bool = Field(
        default=False, description="rescale with the baseline bert-score ships for model and lang, "
        "or with baseline_path")
    use_fast_tokenizer: bool = Field(default=False, description="use the fast (Rust) tokenizer")
    engine: Literal["evalq", "bert_score"] = Field(
        default="evalq", description="evalq: evalq's engine (bert_score's definition; batches by length and "
        "tokens, tokenization beside the device, matching on it); bert_score: the bert-score package's own loop")
    dtype: Literal["fp32", "bf16", "fp16"] = Field(
        default="fp32", description="the forward passes' precision (evalq's engine; matching is fp32): bf16 and "
        "fp16 are faster on a GPU, within about 1e-3 of fp32")
    max_batch_tokens: int | None = Field(
        default=None, ge=64, le=1_048_576, description="tokens (padded) per forward pass (evalq's engine); "
        "unset: 65,536 on a GPU, 2,048 on a CPU")

    @field_validator("model_type")
    @classmethod
    def _model_exists(cls, value, info):
        from evalq.shared.metrics import bertscore

        _as_param_error(bertscore.resolve_model, value, info.data.get("lang"), request_roots_of(info))
        return value

    @field_validator("num_layers")
    @classmethod
    def _layer_exists(cls, value, info):
        if "model_type" in info.data and "lang" in info.data:
            from evalq.shared.metrics import bertscore

            name, path = bertscore.resolve_model(info.data["model_type"], info.data["lang"])
            _as_param_error(bertscore.resolve_layers, name, path, value)
        return value

    @field_validator("baseline_path")
    @classmethod
    def _baseline_file_exists(cls, value, info):
        return local_path(value, info, "file")

    @field_validator("rescale_with_baseline")
    @classmethod
    def _baseline_exists(cls, value, info):
        data = info.data
        if value and all(k in data for k in ("lang", "model_type", "num_layers", "all_layers",
                                                  "baseline_path")):
            from evalq.shared.metrics import bertscore

            name, path = bertscore.resolve_model(data["model_type"], data["lang"])
            layers = bertscore.resolve_layers(name, path, data["num_layers"])
            _as_param_error(bertscore.resolve_baseline, name, path, data["lang"],
                            data["baseline_path"], layers, data["all_layers"], request_roots_of(info))
        return value


def _as_param_error(check, *args):
    """Run a look-up; its ValueError becomes a validation error carrying just its message."""
    try:
        return check(*args)
    except ValueError as exc:
        raise PydanticCustomError("bertscore", "{reason}", {"reason": str(exc)}) from None
