"""factual_knowledge and qa_accuracy's lexical scores against fmeval 1.2.3's own transforms, on
texts that exercise case, punctuation, tabs, articles, empty outputs, several targets and AND."""

from __future__ import annotations

import pytest

from evalq.shared.fmeval.params import FactualKnowledgeParams, QAAccuracyParams
from evalq.workers.fmeval.text import factual_knowledge, qa_accuracy

# (output, target as fmeval holds it: one string, targets joined by the delimiter)
CASES = [
    ("London is the capital of the UK.", "UK<OR>England"),
    ("the capital is LONDON", "london"),
    ("Paris", "paris<OR>Paris, France"),
    ("It is\tParis, France!", "Paris France"),
    ("", "anything"),
    ("an answer", ""),
    ("   padded answer   ", "padded answer"),
    ("The Beatles", "Beatles<OR>the beatles"),
    ("Rome and Milan are in Italy", "Rome<OR>Milan<OR>Naples"),
    ("U.S.A.", "USA"),
    ("a an the", "the"),
    ("forty-two", "forty two<OR>42"),
    ("cats, dogs, cats", "dogs cats birds"),
    ("Tabs\tbetween\twords", "tabs between words"),
]


def instance(output: str, target: str) -> dict:
    return {"id": "x", "actual-output": output, "expected-output": [target]}


@pytest.mark.parametrize("operator", ["OR", "AND"])
@pytest.mark.parametrize("delimiter", ["<OR>", ","])
def test_factual_knowledge_equals_fmeval(fmeval, operator, delimiter):
    expected = fmeval("factual_knowledge", [{"output": o, "target": t, "delimiter": delimiter, "operator": operator}
                                            for o, t in CASES])
    params = FactualKnowledgeParams(logical_operator=operator, target_output_delimiter=delimiter)
    got = [factual_knowledge(instance(o, t), params) for o, t in CASES]
    assert got == expected


def test_qa_accuracy_equals_fmeval(fmeval):
    expected = fmeval("qa_accuracy", [{"output": o, "target": t, "delimiter": "<OR>"} for o, t in CASES])
    got = qa_accuracy([instance(o, t) for o, t in CASES], QAAccuracyParams(bertscore=False))
    assert got == expected


def test_targets_from_several_references_count_like_one_delimited_target():
    params = FactualKnowledgeParams(logical_operator="AND")
    joined = factual_knowledge(instance("Rome and Milan", "Rome<OR>Milan"), params)
    listed = factual_knowledge({"id": "x", "actual-output": "Rome and Milan", "expected-output": ["Rome", "Milan"]},
                               params)
    assert joined == listed == {"factual_knowledge": 1.0, "factual_knowledge_quasi_exact": 1.0}


def test_no_delimiter_keeps_a_reference_whole():
    params = FactualKnowledgeParams(target_output_delimiter=None)
    assert factual_knowledge(instance("UK", "UK<OR>England"), params)["factual_knowledge"] == 0.0


def test_qa_accuracy_is_set_based_unlike_squad_f1():
    """fmeval counts word sets: a repeated word counts once (SQuAD's f1_score counts it twice)."""
    from evalq.shared.metrics.params import NoParams
    from evalq.workers.metrics.lexical import f1_score

    inst = instance("cats cats dogs", "cats dogs dogs")
    fm = qa_accuracy([inst], QAAccuracyParams(bertscore=False))[0]
    assert fm["precision_over_words"] == fm["recall_over_words"] == fm["f1_score"] == 1.0
    assert f1_score(inst, NoParams())["f1"] < 1.0
