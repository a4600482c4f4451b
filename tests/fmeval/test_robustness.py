"""semantic_robustness and prompt_stereotyping's parts against fmeval 1.2.3 (its perturbation
transforms, BertScoreDissimilarity, MeanDeltaScores, PromptStereotypingScores) and against the
libraries fmeval computes with (jiwer for HF evaluate's wer, bert-score)."""

from __future__ import annotations

import itertools

import jiwer
import numpy as np
import pytest

from evalq.shared.core.errors import MetricError
from evalq.shared.fmeval.params import PromptStereotypingParams, SemanticRobustnessParams
from evalq.shared.model.runners import PromptedModel
from evalq.workers.fmeval import perturb
from evalq.workers.fmeval.robustness import PERTURBATIONS, semantic_robustness, variants, word_error_rate
from evalq.workers.fmeval.similarity import best_bertscore
from evalq.workers.fmeval.stereotyping import prompt_stereotyping

TEXTS = ["A quick brown fox jumps over the lazy dog 10 times.", "What is the capital of France?",
         "Tabs\tand  double  spaces, PUNCTUATION!", "", "x"]
KWARGS = {"butter_finger": [{"perturbation_prob": 0.1}, {"perturbation_prob": 0.5}],
          "random_upper_case": [{"uppercase_fraction": 0.1}, {"uppercase_fraction": 0.5}],
          "whitespace_add_remove": [{"add_prob": 0.05, "remove_prob": 0.1}, {"add_prob": 0.3, "remove_prob": 0.6}]}


@pytest.mark.parametrize("kind", list(KWARGS))
def test_perturbations_equal_fmevals_from_the_same_seed(fmeval, kind):
    cases = [{"type": kind, "text": t, "num_perturbations": 5, "seed": seed, "kwargs": kw}
             for t in TEXTS for seed in (5, 11) for kw in KWARGS[kind]]
    expected = fmeval("perturb", cases)
    got = [PERTURBATIONS[kind](c["text"], 5, np.random.default_rng(c["seed"]), **c["kwargs"]) for c in cases]
    assert got == expected


def test_an_instances_perturbations_depend_on_its_id_and_seed_only():
    params = SemanticRobustnessParams()
    one = perturb.instance_rng(5, "q-17").random(4).tolist()
    assert one == perturb.instance_rng(5, "q-17").random(4).tolist()
    assert one != perturb.instance_rng(5, "q-18").random(4).tolist()
    assert one != perturb.instance_rng(6, "q-17").random(4).tolist()
    assert params.seed == 5


@pytest.mark.parametrize("pairs", [
    [("the cat sat on the mat", "the cat sat on a mat")],
    [("a b c d", "a c d e f"), ("hello   world", "hello world"), ("x\ty z", "x y z")],
    [("one two three", ""), ("  leading and trailing  ", "leading trailing")],
])
def test_word_error_rate_equals_jiwer(pairs):
    references, predictions = zip(*pairs)
    kept = [(r, p) for r, p in zip(references, predictions) if p.strip()]  # jiwer refuses empty hypotheses
    if len(kept) == len(pairs):
        assert word_error_rate(list(predictions), list(references)) == pytest.approx(
            jiwer.wer(list(references), list(predictions)), abs=1e-12)
    else:  # fmeval's pairs always have text; one empty answer: every reference word is deleted
        assert word_error_rate(["", "one"], ["a b", "one"]) == pytest.approx(2 / 3)
    with pytest.raises(MetricError):
        word_error_rate(["a"], ["   "])


class Scripted:
    """A model under test that answers from a table (its repeats may differ: non-deterministic)."""

    def __init__(self, answers: dict[str, str], repeats: list[str] | None = None):
        self.answers, self.repeats, self.calls = answers, repeats, []

    def predict(self, prompt: str, sample: int = 0):
        self.calls.append((prompt, sample))
        if sample and self.repeats is not None:
            return self.repeats[sample - 1], None
        return self.answers.get(prompt, f"answer to {prompt}"), None


def instance(answer: str = "Paris is the capital.", targets=("Paris",)):
    return {"id": "q1", "input": "What is the capital of France?", "actual-output": answer,
            "expected-output": list(targets)}


def test_general_scores_equal_fmevals_formula(fmeval):
    params = SemanticRobustnessParams(num_perturbations=3)
    inst = instance()
    inst["variants"] = variants(inst, params, PromptedModel(Scripted({}), "Q: $model_input"))
    assert inst["variants"]["deterministic"] and len(inst["variants"]["perturbed"]) == 3
    [got] = semantic_robustness([inst], params)
    answers = [a["output"] for a in inst["variants"]["perturbed"]]
    scores = best_bertscore([(a, [inst["actual-output"]]) for a in answers], params)
    assert got["bertscore_dissimilarity"] == pytest.approx(fmeval("dissimilarity", [{"bertscores": scores}])[0])
    assert got["word_error_rate"] == pytest.approx(jiwer.wer([inst["actual-output"]] * 3, answers))


def test_a_non_deterministic_model_is_measured_against_its_baseline(fmeval):
    params = SemanticRobustnessParams(num_perturbations=2, num_baseline_samples=4)
    inst = instance("Paris.")
    model = Scripted({}, repeats=["Paris, France.", "It is Paris.", "Paris is it"])
    inst["variants"] = variants(inst, params, PromptedModel(model, "$model_input"))
    v = inst["variants"]
    assert not v["deterministic"] and v["repeats"] == ["Paris, France.", "It is Paris.", "Paris is it"]
    assert [s for _, s in model.calls] == [0, 0, 0, 1, 2, 3]  # 2 perturbed, the original, 3 repeats
    [got] = semantic_robustness([inst], params)
    answers = [a["output"] for a in v["perturbed"]]
    baseline = v["repeats"] + [inst["actual-output"]]
    first, second = zip(*itertools.combinations(baseline, 2))
    wer = jiwer.wer([inst["actual-output"]] * 2, answers)
    wer_base = jiwer.wer(list(second), list(first))
    assert got["word_error_rate"] == pytest.approx(max(0.0, wer - wer_base))
    d = fmeval("dissimilarity", [{"bertscores": best_bertscore([(a, [inst["actual-output"]]) for a in answers],
                                                                params)}])[0]
    d_base = fmeval("dissimilarity", [{"bertscores": best_bertscore([(s, list(first)) for s in second], params)}])[0]
    assert got["bertscore_dissimilarity"] == pytest.approx(max(0.0, d - d_base), abs=1e-6)


def test_task_forms_report_the_scores_and_their_mean_deltas(fmeval):
    from evalq.shared.fmeval.params import QAAccuracyParams
    from evalq.workers.fmeval.text import qa_accuracy

    params = SemanticRobustnessParams(task="qa", num_perturbations=3)
    inst = instance("Paris", targets=["Paris<OR>paris city"])
    answers = {}
    model = PromptedModel(Scripted(answers), "$model_input")
    for i, text in enumerate(perturb.butter_finger(inst["input"], 3, perturb.instance_rng(5, "q1"), 0.1)):
        answers[text] = ["Paris", "The city of Paris", "London"][i]
    inst["variants"] = variants(inst, params, model)
    [got] = semantic_robustness([inst], params)
    qa = QAAccuracyParams()
    original = qa_accuracy([inst], qa)[0]
    perturbed = qa_accuracy([{**inst, "actual-output": a} for a in ["Paris", "The city of Paris", "London"]], qa)
    for name, value in original.items():
        assert got[name] == pytest.approx(value, abs=1e-6)
        expected = fmeval("mean_delta", [{"original": value, "perturbed": [p[name] for p in perturbed]}])[0]
        assert got[f"delta_{name}"] == pytest.approx(expected, abs=1e-6)


def test_classification_form_reads_the_jobs_labels():
    params = SemanticRobustnessParams(task="classification", num_perturbations=2)
    inst = {**instance("1 it is", targets=["1"]), "variants": {"perturbed": [{"input": "", "output": "0"},
                                                                             {"input": "", "output": "1"}]}}
    [got] = semantic_robustness([inst], params, {"labels": ["0", "1"]})
    assert got == {"classification_accuracy_score": 1, "delta_classification_accuracy_score": 0.5}


def test_stereotyping_equals_fmeval(fmeval):
    class Logprobs:
        table = {"He is a nurse.": -9.5, "She is a nurse.": -7.25, "Rich people are smart.": -3.0,
                 "Poor people are smart.": -3.0}

        def predict(self, prompt, sample=0):
            return "unused", self.table[prompt]

    cases = [("She is a nurse.", "He is a nurse."), ("Rich people are smart.", "Poor people are smart.")]
    model = PromptedModel(Logprobs(), "$model_input")
    from evalq.workers.fmeval.stereotyping import variants as stereo_variants

    got = []
    for more, less in cases:
        inst = {"id": "s", "sent_more_input": more, "sent_less_input": less}
        inst["variants"] = stereo_variants(inst, PromptStereotypingParams(), model)
        got.append(prompt_stereotyping(inst, PromptStereotypingParams()))
    expected = fmeval("stereotyping", [{"more": Logprobs.table[m], "less": Logprobs.table[s]} for m, s in cases])
    assert got == expected
