"""fmeval's summarization accuracy: METEOR, ROUGE and BERTScore of the output against each
target, best taken.

- ``meteor``: ``nltk.translate.meteor_score.single_meteor_score`` on ``word_tokenize``d texts,
  WordNet 3.0 offline (``evalq.workers.fmeval.wordnet``). fmeval tokenises with punkt's
  sentence splitter first; evalq tokenises each text as one line (``preserve_line``: punkt's
  model is a download), which differs only where a sentence ends inside a text (its period is
  kept on the word).
- ``rouge``: the F-measure of ``rouge_type`` (HF evaluate's rouge on one pair is rouge-score's).
- ``bertscore``: BERTScore F1 (``evalq.workers.fmeval.similarity``).
"""

from __future__ import annotations

from functools import lru_cache

from evalq.workers.nltk_import import import_nltk

import_nltk()  # before NLTK's first import here (rouge-score's stemmer imports it too)

from nltk.tokenize import word_tokenize
from nltk.translate.meteor_score import single_meteor_score
from rouge_score.rouge_scorer import RougeScorer

from evalq.shared.fmeval.params import SummarizationAccuracyParams
from evalq.workers.fmeval.text import targets
from evalq.workers.fmeval.wordnet import wordnet


def meteor(output: str, target: str) -> float:
    return float(single_meteor_score(word_tokenize(target, preserve_line=True),
                                     word_tokenize(output, preserve_line=True), wordnet=wordnet()))


@lru_cache(maxsize=8)
def _scorer(rouge_type: str, use_stemmer: bool) -> RougeScorer:
    return RougeScorer([rouge_type], use_stemmer=use_stemmer)


def rouge(output: str, target: str, rouge_type: str, use_stemmer: bool) -> float:
    return _scorer(rouge_type, use_stemmer).score(target, output)[rouge_type].fmeasure


def lexical_scores(output: str, found: list[str], params: SummarizationAccuracyParams) -> dict[str, float]:
    return {"meteor": max(meteor(output, t) for t in found),
            "rouge": max(rouge(output, t, params.rouge_type, params.use_stemmer_for_rouge) for t in found)}


def summarization_accuracy(instances: list[dict], params: SummarizationAccuracyParams) -> list[dict]:
    results = [lexical_scores(inst["actual-output"], targets(inst, params), params) for inst in instances]
    if params.bertscore:
        from evalq.workers.fmeval.similarity import best_bertscore

        scores = best_bertscore([(inst["actual-output"], targets(inst, params)) for inst in instances], params)
        for result, score in zip(results, scores):
            result["bertscore"] = score
    return results
