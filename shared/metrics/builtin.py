"""Registry entries for evalq's own metrics (lexical, BERTScore, judge quality, safety, claims).
Importing this module is cheap: implementations are named by path and imported by workers on first
use. The families (fmeval's algorithms, agents) register theirs in rooms of their own;
``evalq.shared.job.schema.catalogue`` brings them all together."""

from __future__ import annotations

import math

from evalq.shared.judging.judges import (ClaimScoreParams, ClaimsParams, DefectJudgeParams, JudgeParams, RubricParams,
                                 RubricsFCParams, SafetyParams)
from evalq.shared.metrics.params import BertScoreParams, BleuParams, NoParams, RougeParams
from evalq.shared.metrics.registry import REGISTRY, MetricSpec

UNIT = (0.0, 1.0)  # scores that are shares or similarities

REGISTRY.register(MetricSpec(
    id="bleu",
    bounds=UNIT,
    params=BleuParams,
    impl="evalq.workers.metrics.lexical:bleu",
    queue="cpu",
    requires=("actual-output", "expected-output"),
    description="Sentence BLEU (nltk sentence_bleu) against all references at once; "
    "wordpunct tokens, case kept.",
))

REGISTRY.register(MetricSpec(
    id="rouge",
    bounds=UNIT,
    params=RougeParams,
    impl="evalq.workers.metrics.lexical:rouge",
    queue="cpu",
    requires=("actual-output", "expected-output"),
    description="ROUGE F-measure per type (precision and recall beside it), "
    "best reference per type (rouge-score score_multi).",
))

REGISTRY.register(MetricSpec(
    id="f1_score",
    bounds=UNIT,
    params=NoParams,
    impl="evalq.workers.metrics.lexical:f1_score",
    queue="cpu",
    item_us=33,
    requires=("actual-output", "expected-output"),
    description="Shared-token precision, recall and F1 after SQuAD normalisation; best reference.",
))

REGISTRY.register(MetricSpec(
    id="exact_match",
    bounds=UNIT,
    params=NoParams,
    impl="evalq.workers.metrics.lexical:exact_match",
    queue="cpu",
    item_us=13,
    requires=("actual-output", "expected-output"),
    description="1 if the answer equals a reference after SQuAD normalisation, else 0.",
))

REGISTRY.register(MetricSpec(
    id="bertscore",
    # cosine similarities: at most 1; below 0 is possible (rescaled with a baseline, most of all)
    bounds=(-math.inf, 1.0),
    params=BertScoreParams,
    impl="evalq.workers.metrics.bertscore.metric:bertscore",
    warm="evalq.workers.metrics.bertscore.metric:warm",
    queue="gpu",
    batch=True,
    # an eighth of the entry's pairs, 512 to 4,096 (a multiple of 512, so of every power-of-two
    # batch_size up to 512): a chunk fills a GPU's forward batches and pays the per-chunk costs rarely
    device_chunk=(512, 4096),
    prepare="evalq.workers.metrics.bertscore.metric:prepare",
    aggregation="distribution",
    requires=("actual-output", "expected-output"),
    description="BERTScore precision, recall and F1 (bert-score), best over the references; "
    "mean and distribution over the items. Offline: bundled all-MiniLM-L6-v2 by default.",
))

# LLM-as-judge quality metrics (Azure AI Studio's set): integers 1 to 5 with
# the judge's one-line reason. Queue "judge": each task goes to judge.<region>
# of one of its judge's deployments. Few items per task: a call takes ~1 s.
_JUDGE_METRICS = [
    ("groundedness", ("actual-output", "context"),
     "Is every claim of the answer supported by the context? 1-5."),
    ("relevance", ("input", "actual-output"),
     "Does the answer address the question (with context, ground truth or the conversation when "
     "present)? 1-5."),
    ("coherence", ("input", "actual-output"), "Do the answer's sentences fit together naturally? 1-5."),
    ("fluency", ("actual-output",), "Is the answer well written and grammatical? 1-5."),
    ("similarity", ("input", "actual-output", "expected-output"),
     "Is the answer equivalent to the ground truth? 1-5, best over references."),
    ("retrieval", ("input", "context"), "Are the retrieved documents (context) useful for the question? 1-5."),
]
for _id, _needs, _description in _JUDGE_METRICS:
    REGISTRY.register(MetricSpec(
        id=_id, params=JudgeParams, impl=f"evalq.workers.metrics.quality:{_id}", queue="judge",
        requires=_needs, aggregation="rating", chunk_size=4, description=_description, panel=True))

REGISTRY.register(MetricSpec(
    id="rubric", params=RubricParams, impl="evalq.workers.metrics.quality:rubric", queue="judge",
    requires=("actual-output",), aggregation="rating", chunk_size=4, panel=True,
    description="Your criteria on your low-precision scale, with optional few-shot examples per score.",
))


# Risk and safety (seed 001): severity 0-7 per harm, aggregated as a defect rate
# at the entry's threshold. content_safety grades the four harms in one call.
_SAFETY = [
    ("hate_unfairness", "Hateful or unfair content in the answer: severity 0-7 (very low to high)."),
    ("sexual", "Sexual content in the answer: severity 0-7 (very low to high)."),
    ("violence", "Violent content in the answer: severity 0-7 (very low to high)."),
    ("self_harm", "Self-harm content in the answer: severity 0-7 (very low to high)."),
    ("content_safety", "The four harms above in ONE judge call per item; results and defect rates per harm "
                       "and for any harm."),
]
for _id, _description in _SAFETY:
    REGISTRY.register(MetricSpec(
        id=_id, params=SafetyParams, impl=f"evalq.workers.metrics.safety:{_id}", queue="judge",
        requires=("actual-output",), aggregation="defect", chunk_size=4,
        description=_description))

REGISTRY.register(MetricSpec(
    id="protected_material", params=DefectJudgeParams, impl="evalq.workers.metrics.safety:protected_material",
    queue="judge", requires=("actual-output",), aggregation="defect", chunk_size=4,
    description="Does the answer reproduce protected text (lyrics, recipes, articles, code)? true is a defect."))
REGISTRY.register(MetricSpec(
    id="indirect_attack", params=DefectJudgeParams, impl="evalq.workers.metrics.safety:indirect_attack",
    queue="judge", requires=("actual-output", "context"), aggregation="defect",
    chunk_size=4,
    description="Did the answer follow instructions injected into its context documents? true is a defect."))

# Claim-based metrics (seed 002): several judge calls per item, claims extracted
# once per text and job. Scores in [0, 1].
_CLAIMS = [
    ("claims_recall", ClaimsParams, ("actual-output", "expected-output"),
     "ClaimsFC: the answer's claims checked against the expected answer (entails 1, contradicts 0, "
     "neither neutral_value), averaged; best reference."),
    ("claims_precision", ClaimsParams, ("actual-output", "expected-output"),
     "ClaimsFC reversed: the expected answer's claims checked against the answer."),
    ("claims_f1", ClaimsParams, ("actual-output", "expected-output"),
     "Harmonic mean of claims_precision and claims_recall; best reference."),
    ("faithfulness", ClaimScoreParams, ("actual-output", "context"),
     "Share of the answer's claims entailed by at least one context passage."),
    ("context_relevancy", ClaimScoreParams, ("input", "actual-output", "context"),
     "Share of context passages needed for the answer."),
    ("rubrics_fc", RubricsFCParams, ("actual-output", "expected-output"),
     "RubricsFC: one of five relations between answer and expected answer, each mapped to a number."),
]
for _id, _params, _needs, _description in _CLAIMS:
    REGISTRY.register(MetricSpec(
        id=_id, params=_params, impl=f"evalq.workers.metrics.claims:{_id}", queue="judge", requires=_needs,
        bounds=UNIT, chunk_size=2, memo=True, description=_description))

REGISTRY.register(MetricSpec(
    id="informationless", params=DefectJudgeParams, impl="evalq.workers.metrics.claims:informationless",
    queue="judge", requires=("actual-output",), aggregation="defect", chunk_size=4,
    description="Does the answer carry no information, only formalities? true is a defect."))
