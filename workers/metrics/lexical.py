"""Lexical metrics: BLEU (NLTK), ROUGE (rouge-score), token F1 and exact match.

Imported only by workers (through the registry's lazy path), so the library
imports sit at module level and stay out of the timed scoring.

Pure functions of one instance and its typed parameters. With several
references each returns the best result for the model, as HarpIA specifies.
"""

from __future__ import annotations

import re
import string
import warnings
from collections import Counter
from functools import lru_cache

from evalq.workers.nltk_import import import_nltk

import_nltk()  # before NLTK's first import here (rouge-score's stemmer imports it too)

from nltk.tokenize import wordpunct_tokenize
from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu
from rouge_score.rouge_scorer import RougeScorer

from evalq.shared.core.bounds import ROUGE_L_TOKENS_ENV, rouge_l_max_tokens
from evalq.shared.core.errors import MetricError
from evalq.shared.metrics.params import BleuParams, NoParams, RougeParams


def _references(instance: dict) -> list[str]:
    return instance["expected-output"]


# --- BLEU ---------------------------------------------------------------------

@lru_cache(maxsize=16)
def _smoothing(name: str):
    return getattr(SmoothingFunction(), name)


def bleu(instance: dict, params: BleuParams) -> float:
    hypothesis = wordpunct_tokenize(instance["actual-output"])
    references = [wordpunct_tokenize(r) for r in _references(instance)]
    with warnings.catch_warnings():
        # method0 warns on every sentence without higher-order overlaps; the
        # score (0) is the documented result, the warning is noise in worker logs.
        warnings.simplefilter("ignore")
        return float(sentence_bleu(
            references,
            hypothesis,
            weights=tuple(params.weights),
            smoothing_function=_smoothing(params.smoothing_function),
            auto_reweigh=params.auto_reweigh,
        ))


# --- ROUGE --------------------------------------------------------------------

@lru_cache(maxsize=16)
def _rouge_scorer(rouge_types: tuple[str, ...], use_stemmer: bool):
    return RougeScorer(list(rouge_types), use_stemmer=use_stemmer)


# rouge-score's DefaultTokenizer: lower-cased runs of a-z and 0-9 (stemming keeps the count)
_ROUGE_TOKEN = re.compile(r"[a-z0-9]+")
_QUADRATIC = ("rougeL", "rougeLsum")


def _check_lcs_size(instance: dict, rouge_types: list[str]) -> None:
    """ROUGE-L/Lsum compare every token of the answer with every token of a
    reference (a longest common subsequence): a text over the token limit is an
    error on its item, not minutes of work."""
    limit = rouge_l_max_tokens()
    if not limit or not any(t in _QUADRATIC for t in rouge_types):
        return
    for what, text in [("actual-output", instance["actual-output"])] + [
            (f"expected-output[{i}]", ref) for i, ref in enumerate(_references(instance))]:
        if len(text) <= limit:  # a token is at least one character: no need to count
            continue
        tokens = sum(1 for _ in _ROUGE_TOKEN.finditer(text.lower()))
        if tokens > limit:
            types = "/".join(t for t in rouge_types if t in _QUADRATIC)
            raise MetricError(f"{what} has {tokens} tokens, over the limit of {limit} per text for {types} "
                              f"(quadratic in tokens); {ROUGE_L_TOKENS_ENV} raises it")


def rouge(instance: dict, params: RougeParams) -> dict[str, float]:
    _check_lcs_size(instance, params.rouge_types)
    scorer = _rouge_scorer(tuple(params.rouge_types), params.use_stemmer)
    # score_multi keeps, per type, the reference with the best F-measure.
    scores = scorer.score_multi(_references(instance), instance["actual-output"])
    result: dict[str, float] = {}
    for rouge_type in params.rouge_types:
        s = scores[rouge_type]
        result[rouge_type] = s.fmeasure
        result[f"{rouge_type}_precision"] = s.precision
        result[f"{rouge_type}_recall"] = s.recall
    return result


# --- SQuAD-normalised token F1 and exact match -------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lowercase, drop punctuation and articles, squeeze spaces."""
    text = text.lower().translate(_PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _token_prf(prediction: str, reference: str) -> tuple[float, float, float]:
    pred = normalize_answer(prediction).split()
    ref = normalize_answer(reference).split()
    if not pred or not ref:
        # SQuAD v2: two empty answers agree; one empty answer scores 0.
        same = float(pred == ref)
        return same, same, same
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0, 0.0, 0.0
    precision = common / len(pred)
    recall = common / len(ref)
    return precision, recall, 2 * precision * recall / (precision + recall)


def f1_score(instance: dict, params: NoParams) -> dict[str, float]:
    best = max(
        (_token_prf(instance["actual-output"], ref) for ref in _references(instance)),
        key=lambda prf: prf[2],
    )
    return {"f1": best[2], "precision": best[0], "recall": best[1]}


def exact_match(instance: dict, params: NoParams) -> int:
    answer = normalize_answer(instance["actual-output"])
    return int(any(answer == normalize_answer(ref) for ref in _references(instance)))
