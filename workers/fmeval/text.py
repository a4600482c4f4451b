"""fmeval's text comparisons: factual knowledge (containment) and QA accuracy (equality and
set-based word overlap), each taken over the targets a reference holds.

These are not evalq's SQuAD metrics (``exact_match``, ``f1_score``): fmeval counts words as
sets, splits on whitespace after its own normalisation (``normalize_text_quac_protocol``,
which splits on spaces only, so a tab stays inside a word), and its exact match compares the
stripped texts without normalising them.
"""

from __future__ import annotations

import string
from typing import Callable

from evalq.shared.fmeval.params import FactualKnowledgeParams, QAAccuracyParams, Targets

_PUNCTUATION = frozenset(string.punctuation)  # fmeval's ENGLISH_PUNCTUATIONS
_ARTICLES = frozenset({"a", "an", "the"})      # fmeval's ENGLISH_ARTICLES


def normalize(text: str) -> str:
    """fmeval's ``normalize_text_quac_protocol``: lower-case, drop punctuation, split on
    spaces, drop empty words and articles."""
    text = "".join(c for c in text.lower() if c not in _PUNCTUATION)
    return " ".join(w for w in text.split(" ") if w and w not in _ARTICLES)


def targets(instance: dict, params: Targets) -> list[str]:
    """The instance's targets: each reference split on ``target_output_delimiter`` (fmeval's
    ``target_output.split(delimiter)``; a DataConfig's delimiter already split them)."""
    delimiter = params.target_output_delimiter
    return [t for ref in instance["expected-output"] for t in (ref.split(delimiter) if delimiter else [ref])]


# --- factual knowledge ---------------------------------------------------------------------

def _inclusion(output: str, target: str) -> float:
    return float(target.lower() in output.lower())


def _quasi_inclusion(output: str, target: str) -> float:
    return float(normalize(target.strip()) in normalize(output.strip()))


def factual_knowledge(instance: dict, params: FactualKnowledgeParams) -> dict[str, float]:
    """``factual_knowledge``: a target is in the output, case-folded; ``..._quasi_exact``: the
    same after normalising both. OR: any target (max); AND: every target (min)."""
    output, found = instance["actual-output"], targets(instance, params)
    combine = max if params.logical_operator == "OR" else min
    return {"factual_knowledge": combine(_inclusion(output, t) for t in found),
            "factual_knowledge_quasi_exact": combine(_quasi_inclusion(output, t) for t in found)}


# --- QA accuracy ---------------------------------------------------------------------------

def _words(text: str) -> set[str]:
    return set(normalize(text.strip()).split())


def _overlap(output: str, target: str) -> tuple[float, float, float]:
    """Precision, recall and F1 over word sets (nltk.metrics.scores' precision, recall and
    f_measure with alpha 0.5; an empty set makes precision or recall, and F1, 0)."""
    test, reference = _words(output), _words(target)
    common = len(test & reference)
    precision = common / len(test) if test else 0.0
    recall = common / len(reference) if reference else 0.0
    f1 = 0.0 if precision == 0 or recall == 0 else 1.0 / (0.5 / precision + 0.5 / recall)
    return precision, recall, f1


QA_SCORES: dict[str, Callable[[str, str], float]] = {
    "exact_match_score": lambda o, t: float(o.strip() == t.strip()),
    "quasi_exact_match_score": lambda o, t: float(normalize(o.strip()) == normalize(t.strip())),
    "precision_over_words": lambda o, t: _overlap(o, t)[0],
    "recall_over_words": lambda o, t: _overlap(o, t)[1],
    "f1_score": lambda o, t: _overlap(o, t)[2],
}


def qa_scores(output: str, found: list[str]) -> dict[str, float]:
    """Each QA accuracy score, its own maximum over the targets (as fmeval takes it)."""
    return {name: max(score(output, t) for t in found) for name, score in QA_SCORES.items()}


def qa_accuracy(instances: list[dict], params: QAAccuracyParams) -> list[dict | Exception]:
    """fmeval's QA accuracy per item; with ``bertscore``, its BERTScore F1 against the best target
    too (one batched bert-score pass over the chunk)."""
    results: list[dict | Exception] = []
    for inst in instances:
        results.append(qa_scores(inst["actual-output"], targets(inst, params)))
    if params.bertscore:
        from evalq.workers.fmeval.similarity import best_bertscore

        pairs = [(inst["actual-output"], targets(inst, params)) for inst in instances]
        for result, score in zip(results, best_bertscore(pairs, params)):
            result["bertscore"] = score
    return results
