"""What makes a run part of a nightly series: its ``suite`` (the name its runs are
grouped under in the history store) and how its regressions are judged.

A job says (top level of the job file; the request's ``suite`` or ``evalq run/submit
--suite`` override the name)::

    "suite": "rag-nightly",
    "regression": {"baseline": 7, "min_effect": 0.01, "alpha": 0.05,
                   "dataset": "3f9c2a1b", "dataset_fields": ["input", "expected-output"]}

A job that names no suite belongs to the suite named after its job file (``rag.json``
-> ``rag``); a request's inline job without one to ``default``. Omitted ``regression``
fields take the operator's defaults: ``EVALQ_REGRESSION_BASELINE`` (7 runs),
``EVALQ_REGRESSION_MIN_EFFECT`` (0.01) and ``EVALQ_REGRESSION_ALPHA`` (0.05).

``dataset`` pins the baseline to a dataset version (a digest or its first 8+ hex characters, as
run.json and ``evalq history`` show it): the night is compared with the suite's runs on that
version, over the items it shares with it unchanged. ``dataset_fields``: the instance fields a
version covers (default: all but the answer, retrieved context, transcript, people's grades:
``evalq.shared.data.versions``).
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Annotated
from urllib.parse import urlparse

from pydantic import Field

from evalq.shared.core.config import env_number
from evalq.shared.core.strict import Strict

SUITE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,127}$"
_SUITE = re.compile(SUITE_PATTERN)
DEFAULT_SUITE = "default"
_SUFFIXES = (".gz", ".json", ".jsonl")


def suite_problem(value) -> str | None:
    """Why ``value`` cannot name a suite, or None."""
    if isinstance(value, str) and _SUITE.match(value):
        return None
    return ("expected a name of 1 to 128 letters, digits and _ . : / @ + - (starting with a letter or digit)"
            f", got {str(value)[:80]!r}")


def suite_of(source: str) -> str:
    """The suite a job that names none belongs to: its file's name without extensions."""
    if source.startswith("request."):
        return DEFAULT_SUITE
    name = PurePosixPath(urlparse(source).path if "://" in source else source.replace("\\", "/")).name
    for suffix in _SUFFIXES:
        name = name.removesuffix(suffix)
    name = re.sub(r"[^A-Za-z0-9_.:/@+-]", "_", name).lstrip("_.:/@+-")[:128]
    return name or DEFAULT_SUITE


class Regression(Strict):
    """How a run's entries are judged against the suite's earlier runs (None: the operator's default)."""

    baseline: int | None = Field(default=None, ge=1, le=100,
                                 description="compare with the last this many runs of the suite that ended done")
    min_effect: float | None = Field(default=None, ge=0, allow_inf_nan=False,
                                     description="a smaller move (in the value's own units) is never a regression")
    alpha: float | None = Field(default=None, gt=0, lt=1, description="significance level")
    dataset: str | None = Field(default=None, pattern=r"^[0-9a-f]{8,32}$",
                                description="the dataset version (digest, or its first 8+ hex characters) the "
                                            "baseline is pinned to")
    min_alpha: float | None = Field(default=None, ge=-1, le=1, allow_inf_nan=False,
                                    description="the judges' least Krippendorff alpha against people's labels of a "
                                                "night before it is alerted (None: EVALQ_LABELS_MIN_ALPHA)")
    dataset_fields: list[Annotated[str, Field(min_length=1, max_length=200)]] | None = Field(
        default=None, min_length=1, max_length=100,
        description="the instance fields a dataset version covers (default: all but actual-output, context, "
                    "messages, human, otel)")

    def resolved(self) -> "Regression":
        """These settings with every omitted field at the operator's default."""
        return Regression(
            baseline=self.baseline if self.baseline is not None else int(env_number("EVALQ_REGRESSION_BASELINE", 7)) or 7,
            min_effect=self.min_effect if self.min_effect is not None
            else float(env_number("EVALQ_REGRESSION_MIN_EFFECT", 0.01)),
            alpha=self.alpha if self.alpha is not None else float(env_number("EVALQ_REGRESSION_ALPHA", 0.05)) or 0.05,
            dataset=self.dataset, dataset_fields=self.dataset_fields,
            min_alpha=self.min_alpha if self.min_alpha is not None else float(env_number("EVALQ_LABELS_MIN_ALPHA", 0.667)))


class Review(Strict):
    """Which of a night's judged items are put in front of a person (``evalq.results.review``): at most
    ``items`` of them (None: the operator's ``EVALQ_REVIEW_ITEMS``, 0 by default: none)."""

    items: int | None = Field(default=None, ge=0, le=10_000, description="items chosen for review each night")
    band: float = Field(default=0.5, ge=0, le=10, allow_inf_nan=False,
                        description="an item whose score lies within this of the pass threshold's edge is near it")
    spread: float = Field(default=2, gt=0, le=100, allow_inf_nan=False,
                          description="a panel item whose members' scores differ by this much or more is a disagreement")
    random: float = Field(default=0.2, ge=0, le=1, allow_inf_nan=False,
                          description="the share of the items drawn at random, stratified by category")

    def resolved(self) -> "Review":
        items = self.items if self.items is not None else int(env_number("EVALQ_REVIEW_ITEMS", 0))
        return self.model_copy(update={"items": max(0, items)})
