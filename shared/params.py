"""Typed parameter models, one per metric. ``extra="forbid"``: a misspelt
parameter is an error that names it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class NoParams(Params):
    pass


SmoothingName = Literal[
    "method0", "method1", "method2", "method3", "method4", "method5", "method6", "method7"
]


class BleuParams(Params):
    """``nltk.translate.bleu_score.sentence_bleu``'s three parameters."""

    weights: list[float] = Field(
        default=[0.25, 0.25, 0.25, 0.25],
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
        if any(w < 0 for w in value):
            raise ValueError("weights must not be negative")
        return value


RougeType = Literal[
    "rouge1", "rouge2", "rouge3", "rouge4", "rouge5", "rouge6", "rouge7", "rouge8", "rouge9",
    "rougeL", "rougeLsum",
]


class RougeParams(Params):
    """``rouge_score.rouge_scorer.RougeScorer``'s parameters."""

    rouge_types: list[RougeType] = Field(
        default=["rouge1", "rouge2", "rougeL"], description="ROUGE variants to compute"
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
