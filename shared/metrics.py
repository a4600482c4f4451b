"""Registry entries for every metric evalq ships. Importing this module is cheap:
implementations are named by path and imported by workers on first use."""

from __future__ import annotations

from evalq.shared.judges import JudgeParams, RubricParams
from evalq.shared.params import BertScoreParams, BleuParams, NoParams, RougeParams
from evalq.shared.registry import REGISTRY, MetricSpec

REGISTRY.register(MetricSpec(
    id="bleu",
    params=BleuParams,
    impl="evalq.workers.metrics.lexical:bleu",
    queue="cpu",
    requires=("actual-output", "expected-output"),
    library="nltk",
    description="Sentence BLEU (nltk sentence_bleu) against all references at once; "
    "wordpunct tokens, case kept.",
))

REGISTRY.register(MetricSpec(
    id="rouge",
    params=RougeParams,
    impl="evalq.workers.metrics.lexical:rouge",
    queue="cpu",
    requires=("actual-output", "expected-output"),
    library="rouge-score",
    description="ROUGE F-measure per type (precision and recall beside it), "
    "best reference per type (rouge-score score_multi).",
))

REGISTRY.register(MetricSpec(
    id="f1_score",
    params=NoParams,
    impl="evalq.workers.metrics.lexical:f1_score",
    queue="cpu",
    requires=("actual-output", "expected-output"),
    description="Shared-token precision, recall and F1 after SQuAD normalisation; best reference.",
))

REGISTRY.register(MetricSpec(
    id="exact_match",
    params=NoParams,
    impl="evalq.workers.metrics.lexical:exact_match",
    queue="cpu",
    requires=("actual-output", "expected-output"),
    description="1 if the answer equals a reference after SQuAD normalisation, else 0.",
))

REGISTRY.register(MetricSpec(
    id="bertscore",
    params=BertScoreParams,
    impl="evalq.workers.metrics.bertscore:bertscore",
    queue="gpu",
    batch=True,
    # a multiple of every power-of-two batch_size up to 512: full batches
    chunk_size=512,
    prepare="evalq.workers.metrics.bertscore:prepare",
    aggregation="distribution",
    requires=("actual-output", "expected-output"),
    library="bert-score",
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
        requires=_needs, aggregation="rating", chunk_size=4, description=_description))

REGISTRY.register(MetricSpec(
    id="rubric", params=RubricParams, impl="evalq.workers.metrics.quality:rubric", queue="judge",
    requires=("actual-output",), aggregation="rating", chunk_size=4,
    description="Your criteria on your low-precision scale, with optional few-shot examples per score.",
))


def load_plugins() -> None:
    """Import the modules named in ``EVALQ_PLUGINS`` (comma-separated); each
    registers its own metrics. The orchestrator and every worker must see the
    same value, so a cluster's workers are started with it too."""
    import importlib
    import os

    for name in filter(None, (m.strip() for m in os.environ.get("EVALQ_PLUGINS", "").split(","))):
        importlib.import_module(name)


load_plugins()
