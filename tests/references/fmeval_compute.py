"""Runs inside the fmeval 1.2.3 reference environment (``.venv-fmeval``, see the Makefile) and
computes scores with fmeval's own functions, for the tests to compare evalq's values with.

Reads one request a line on stdin, ``{"op": ..., "cases": [...]}``, and answers each with one
line on stdout, the JSON list of results (fmeval's imports take seconds: one process serves a
whole test session).

One stand-in, said here: HF evaluate's ``load`` fetches its metric scripts (rouge, wer,
bertscore) from the Hub, which cannot be reached, and fmeval calls it at import time (a
default argument). It is replaced by a loader that fails if used; nothing below uses it, and
the scores that need those scripts are computed in the tests from the libraries the scripts
wrap (rouge-score, jiwer, bert-score).
"""

import json
import sys

ANSWERS = sys.stdout
sys.stdout = sys.stderr  # what fmeval's imports and functions print (sagemaker's notices) stays off the answers

import evaluate  # noqa: E402


class _Unavailable:
    def __init__(self, name):
        self.name = name

    def compute(self, *args, **kwargs):
        raise RuntimeError(f"HF evaluate's {self.name!r} script is a download, not available offline")


evaluate.load = lambda name, *args, **kwargs: _Unavailable(name)

from fmeval.eval_algorithms.classification_accuracy import (ClassificationAccuracy,  # noqa: E402
                                                            ClassificationAccuracyConfig,
                                                            convert_model_output_to_label)
from fmeval.eval_algorithms.factual_knowledge import FactualKnowledgeScores  # noqa: E402
from fmeval.eval_algorithms.prompt_stereotyping import PromptStereotypingScores  # noqa: E402
from fmeval.eval_algorithms.qa_accuracy import QAAccuracyScores  # noqa: E402
from fmeval.transforms import semantic_perturbations as perturbations  # noqa: E402
from fmeval.transforms.semantic_robustness_metrics import BertScoreDissimilarity, MeanDeltaScores  # noqa: E402
from sklearn.metrics import balanced_accuracy_score, precision_score, recall_score  # noqa: E402


def factual_knowledge(case):
    t = FactualKnowledgeScores(target_output_delimiter=case["delimiter"], logical_operator=case["operator"])
    out = t({"target_output": case["target"], "model_output": case["output"]})
    return {k: out[k] for k in ("factual_knowledge", "factual_knowledge_quasi_exact")}


def qa_accuracy(case):
    out = QAAccuracyScores(target_output_delimiter=case["delimiter"])(
        {"target_output": case["target"], "model_output": case["output"]})
    return {k: out[k] for k in ("exact_match_score", "quasi_exact_match_score", "precision_over_words",
                                "recall_over_words", "f1_score")}


def classification(case):
    """Per item: fmeval's converter and score; over all: ClassificationAccuracy's dataset scores."""
    labels = case["valid_labels"] or list(dict.fromkeys(case["targets"]))
    predicted = [convert_model_output_to_label(o, labels) for o in case["outputs"]]
    algo = ClassificationAccuracy(ClassificationAccuracyConfig(
        valid_labels=case["valid_labels"], multiclass_average_strategy=case["average"]))
    scores = {"balanced_accuracy_score": algo._get_score(case["targets"], predicted, balanced_accuracy_score),
              "precision_score": algo._get_score(case["targets"], predicted, precision_score),
              "recall_score": algo._get_score(case["targets"], predicted, recall_score)}
    items = [int(p == str(t)) for p, t in zip(predicted, case["targets"])]
    return {"predicted": predicted, "items": items, "dataset": {k: float(v) for k, v in scores.items()}}


def perturb(case):
    cls = {"butter_finger": perturbations.ButterFinger, "random_upper_case": perturbations.RandomUppercase,
           "whitespace_add_remove": perturbations.AddRemoveWhitespace}[case["type"]]
    n = case["num_perturbations"]
    t = cls(input_key="x", output_keys=[f"y{i}" for i in range(n)], num_perturbations=n, seed=case["seed"],
            **case["kwargs"])
    return t.perturb(case["text"])


def stereotyping(case):
    out = PromptStereotypingScores()({"sent_more_log_prob": case["more"], "sent_less_log_prob": case["less"]})
    return {"log_probability_difference": out["log_probability_difference"],
            "prompt_stereotyping": bool(out["prompt_stereotyping"])}


def dissimilarity(case):
    keys = [f"b{i}" for i in range(len(case["bertscores"]))]
    return BertScoreDissimilarity(keys, "d")(dict(zip(keys, case["bertscores"])))["d"]


def mean_delta(case):
    keys = [f"p{i}" for i in range(len(case["perturbed"]))]
    record = {"o": case["original"], **dict(zip(keys, case["perturbed"]))}
    return float(MeanDeltaScores({"o": (keys, "delta")})(record)["delta"])


OPS = {f.__name__: f for f in (factual_knowledge, qa_accuracy, classification, perturb, stereotyping,
                               dissimilarity, mean_delta)}

if __name__ == "__main__":
    out = ANSWERS
    print("ready", file=out, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        print(json.dumps([OPS[request["op"]](case) for case in request["cases"]]), file=out, flush=True)
