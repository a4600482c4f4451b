"""The pairwise comparison, registered (imported by ``evalq.shared.job.catalogue``)."""

from __future__ import annotations

import evalq.shared.pairwise.aggregate  # noqa: F401  (registers the "pairwise" aggregation)
from evalq.shared.metrics.registry import REGISTRY, MetricSpec
from evalq.shared.pairwise.params import PairwiseParams

REGISTRY.register(MetricSpec(
    id="pairwise", params=PairwiseParams, impl="evalq.workers.pairwise.compare:pairwise", queue="judge",
    requires=("input", "actual-output", "baseline-output"), aggregation="pairwise", chunk_size=4,
    description="A judge compares the candidate's answer (actual-output) with the baseline's (baseline-output), "
                "asked in both orders: win, tie and loss rates, and the judge's first-position, flip and "
                "length figures."))
