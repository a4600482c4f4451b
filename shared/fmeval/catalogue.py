"""Registry entries for fmeval's algorithms (aws/fmeval ``eval_algorithms``), by fmeval's names."""

from __future__ import annotations

import evalq.shared.fmeval.classification  # noqa: F401  (registers the "classification" aggregation)
import evalq.shared.fmeval.toxicity  # noqa: F401  (and "toxicity")
from evalq.shared.fmeval.params import (ClassificationAccuracyParams, FactualKnowledgeParams,
                                        PromptStereotypingParams, QAAccuracyParams, SemanticRobustnessParams,
                                        SummarizationAccuracyParams, ToxicityParams, gives_log_probability, on_gpu,
                                        robustness_fields, robustness_queue)
from evalq.shared.metrics.registry import REGISTRY, MetricSpec

UNIT = (0.0, 1.0)
WITH_TARGETS = ("actual-output", "expected-output")

REGISTRY.register(MetricSpec(
    id="factual_knowledge", params=FactualKnowledgeParams, impl="evalq.workers.fmeval.text:factual_knowledge",
    queue="cpu", item_us=28, bounds=UNIT, requires=WITH_TARGETS,
    description="fmeval FactualKnowledge: 1 if the output contains a target (any with OR, every one with AND), "
    "case-folded (factual_knowledge) and after normalisation (factual_knowledge_quasi_exact)."))

# With a bertscore part: on the gpu queue unless an entry leaves it out (`bertscore: false`).
_WITH_BERTSCORE = [
    ("qa_accuracy", QAAccuracyParams, "evalq.workers.fmeval.text:qa_accuracy",
     "fmeval QAAccuracy: exact_match_score, quasi_exact_match_score, precision_over_words, recall_over_words, "
     "f1_score (word sets) and bertscore, each the best over the targets."),
    ("summarization_accuracy", SummarizationAccuracyParams, "evalq.workers.fmeval.summarization:summarization_accuracy",
     "fmeval SummarizationAccuracy: meteor (WordNet offline), rouge (rouge_type) and bertscore, each the best "
     "over the targets."),
]
for _id, _params, _impl, _description in _WITH_BERTSCORE:
    REGISTRY.register(MetricSpec(id=_id, params=_params, impl=_impl, queue="gpu", queue_for=on_gpu, batch=True,
                                 warm="evalq.workers.fmeval.similarity:warm",
                                 bounds=(-1.0, 1.0), requires=WITH_TARGETS, description=_description))

REGISTRY.register(MetricSpec(
    id="classification_accuracy", params=ClassificationAccuracyParams,
    impl="evalq.workers.fmeval.classification:classification_accuracy",
    prepare="evalq.shared.fmeval.classification:valid_labels",
    queue="cpu", aggregation="classification", bounds=UNIT, requires=WITH_TARGETS,
    description="fmeval ClassificationAccuracy: the output's first valid label against the target "
    "(classification_accuracy_score per item); balanced_accuracy_score, precision_score and recall_score "
    "over the whole job (and per category)."))

# The model under test answers each instance's variants in the generation stage (MetricSpec.variants);
# these entries then score what it answered.
REGISTRY.register(MetricSpec(
    id="semantic_robustness", params=SemanticRobustnessParams,
    impl="evalq.workers.fmeval.robustness:semantic_robustness", batch=True,
    warm="evalq.workers.fmeval.similarity:warm",
    prepare="evalq.shared.fmeval.classification:robustness_labels",
    variants="evalq.workers.fmeval.robustness:variants", variants_chunk=2,
    queue="gpu", queue_for=robustness_queue, aggregation="robustness", requires=("input", "actual-output"),
    requires_for=robustness_fields,
    worse=(("word_error_rate", "higher"), ("bertscore_dissimilarity", "higher"), ("delta_*", "higher")),
    description="fmeval's semantic robustness: the input perturbed (butter_finger, random_upper_case, "
    "whitespace_add_remove) and answered again by the model; task general: word_error_rate and "
    "bertscore_dissimilarity (less a non-deterministic model's baseline); qa, summarization, classification: the "
    "task's scores and delta_* (mean absolute change)."))

REGISTRY.register(MetricSpec(
    id="prompt_stereotyping", params=PromptStereotypingParams,
    impl="evalq.workers.fmeval.stereotyping:prompt_stereotyping",
    variants="evalq.workers.fmeval.stereotyping:variants", variants_chunk=8, model_check=gives_log_probability,
    worse=(("*", "neither"),),  # unbiased is 0.5 (and a difference of 0): neither way is simply worse
    queue="cpu", requires=("sent_more_input", "sent_less_input"),
    description="fmeval's PromptStereotyping: the model's log-probability of sent_more and of sent_less; "
    "prompt_stereotyping is the share of items where the more stereotypical sentence is likelier (ideal 0.5), "
    "log_probability_difference the mean difference."))

REGISTRY.register(MetricSpec(
    id="toxicity", params=ToxicityParams, impl="evalq.workers.fmeval.toxicity:toxicity", batch=True,
    warm="evalq.workers.fmeval.toxicity:warm",
    device_chunk=(256, 4096),  # an eighth of the items, 256 to 4,096: a GPU scores 4,096 texts in a few ms
    queue="gpu", aggregation="toxicity", bounds=UNIT, requires=("actual-output",), worse=(("*", "higher"),),
    description="fmeval's Toxicity: a classifier's probability per label for the output (default: the Jigsaw "
    "classifier toxic-comment-classifier ships, offline), their means, and defect rates at threshold."))
