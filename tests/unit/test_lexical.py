"""Lexical metrics against the reference libraries computed directly here."""

from __future__ import annotations

import pytest
from nltk.tokenize import wordpunct_tokenize
from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu
from rouge_score.rouge_scorer import RougeScorer

from evalq.shared.metrics.params import BleuParams, NoParams, RougeParams
from evalq.workers.metrics.lexical import bleu, exact_match, f1_score, normalize_answer, rouge

PAIRS = [
    ("The cat is sleeping on the sofa.", ["The cat is sleeping on the sofa.", "A cat sleeps."]),
    ("I like reading books at night.", ["I like to read books at night.", "I enjoy reading in the evening."]),
    ("The meeting was postponed until tomorrow.", ["The meeting has been postponed to tomorrow."]),
    ("It rained, a lot; overnight!", ["It rained heavily during the night.", "There was a lot of rain."]),
    ("Completely unrelated words here", ["Nothing in common at all"]),
    ("short", ["a much longer reference sentence with many words"]),
    ("Running runners ran quickly", ["The runner runs quick", "runners running"]),
]


def inst(hyp: str, refs: list[str]) -> dict:
    return {"id": "x", "actual-output": hyp, "expected-output": refs}


@pytest.mark.parametrize("hyp,refs", PAIRS)
@pytest.mark.parametrize("smoothing", [f"method{i}" for i in range(8)])
def test_bleu_equals_nltk_sentence_bleu(hyp, refs, smoothing):
    params = BleuParams(smoothing_function=smoothing)
    try:
        expected = sentence_bleu([wordpunct_tokenize(r) for r in refs], wordpunct_tokenize(hyp),
                                 smoothing_function=getattr(SmoothingFunction(), smoothing))
    except (ZeroDivisionError, AssertionError) as exc:
        # nltk's method6 refuses some inputs; evalq must not invent a value:
        # it raises too, and the runner records the error on that item.
        with pytest.raises(type(exc)):
            bleu(inst(hyp, refs), params)
        return
    assert bleu(inst(hyp, refs), params) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("hyp,refs", PAIRS)
@pytest.mark.parametrize("weights,auto", [([1.0], False), ([0.5, 0.5], False), ([0.25] * 4, True),
                                          ([0.1, 0.2, 0.3, 0.4], False)])
def test_bleu_weights_and_auto_reweigh(hyp, refs, weights, auto):
    params = BleuParams(weights=weights, smoothing_function="method1", auto_reweigh=auto)
    expected = sentence_bleu([wordpunct_tokenize(r) for r in refs], wordpunct_tokenize(hyp),
                             weights=tuple(weights), smoothing_function=SmoothingFunction().method1,
                             auto_reweigh=auto)
    assert bleu(inst(hyp, refs), params) == pytest.approx(expected, abs=1e-12)


def test_bleu_keeps_case():
    params = BleuParams(weights=[1.0])
    assert bleu(inst("the cat", ["the cat"]), params) == pytest.approx(1.0)
    assert bleu(inst("THE CAT", ["the cat"]), params) == 0.0


@pytest.mark.parametrize("hyp,refs", PAIRS)
@pytest.mark.parametrize("stem", [False, True])
def test_rouge_is_best_reference_per_type(hyp, refs, stem):
    types = ["rouge1", "rouge2", "rougeL", "rougeLsum"]
    result = rouge(inst(hyp, refs), RougeParams(rouge_types=types, use_stemmer=stem))
    scorer = RougeScorer(types, use_stemmer=stem)
    per_ref = [scorer.score(r, hyp) for r in refs]
    for t in types:
        best = max(per_ref, key=lambda s: s[t].fmeasure)[t]
        assert result[t] == pytest.approx(best.fmeasure, abs=1e-12)
        assert result[f"{t}_precision"] == pytest.approx(best.precision, abs=1e-12)
        assert result[f"{t}_recall"] == pytest.approx(best.recall, abs=1e-12)
    assert set(result) == {f"{t}{s}" for t in types for s in ("", "_precision", "_recall")}


# (prediction, references, expected f1, precision, recall): SQuAD's definition by hand
F1_TABLE = [
    ("The Cat sat.", ["a cat sat"], 1.0, 1.0, 1.0),
    ("cat sat on mat", ["the cat sat"], 2 / 3, 0.5, 1.0),
    ("dog", ["cat", "dog barked loudly"], 0.5, 1.0, 1 / 3),
    ("nothing shared", ["cat"], 0.0, 0.0, 0.0),
    ("the", ["a"], 1.0, 1.0, 1.0),  # both empty after normalisation
    ("the", ["cat"], 0.0, 0.0, 0.0),
    ("cat cat cat", ["cat"], 0.5, 1 / 3, 1.0),
]


@pytest.mark.parametrize("pred,refs,f1,p,r", F1_TABLE)
def test_f1_score_table(pred, refs, f1, p, r):
    out = f1_score(inst(pred, refs), NoParams())
    assert out == pytest.approx({"f1": f1, "precision": p, "recall": r})


@pytest.mark.parametrize("pred,refs,expected", [
    ("The Eiffel Tower!", ["eiffel tower"], 1),
    ("Eiffel Tower, Paris", ["eiffel tower"], 0),
    ("Paris", ["London", "paris."], 1),
    ("an apple", ["apple", "pear"], 1),
    ("", ["apple"], 0),
])
def test_exact_match_table(pred, refs, expected):
    assert exact_match(inst(pred, refs), NoParams()) == expected


def test_normalize_answer_matches_squad():
    assert normalize_answer("  The  Quick, brown fox -- an example! ") == "quick brown fox example"
