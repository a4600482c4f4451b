"""fmeval's semantic robustness: how much the model's answers change when its input is perturbed
in ways that keep the meaning (GeneralSemanticRobustness and the QA, summarization and
classification forms).

Two steps, as the pipeline runs them:

- ``variants`` (the generation stage, on the model's queue): the instance's input perturbed
  ``num_perturbations`` times (seeded per instance), each answered by the model; for the general
  task also the unperturbed input asked again, to see whether the model is deterministic, and if
  it is not, more repeats for fmeval's baseline (``num_baseline_samples``).
- ``semantic_robustness`` (cpu, or gpu for its bertscore part): the scores, from the instance's
  output (``actual-output``: the model's answer to the unperturbed input, from the dataset or the
  generation stage) and those answers.

fmeval decides determinism once per dataset (two calls on each of its first 5 records) and then
computes a baseline for every record or none; evalq decides per instance (its own two calls),
which needs no order between workers.
"""

from __future__ import annotations

import itertools
import re
from statistics import mean

from evalq.shared.core.errors import MetricError
from evalq.shared.fmeval.params import SemanticRobustnessParams
from evalq.shared.model.runners import PromptedModel
from evalq.workers.fmeval import perturb

PERTURBATIONS = {"butter_finger": perturb.butter_finger, "random_upper_case": perturb.random_upper_case,
                 "whitespace_add_remove": perturb.whitespace_add_remove}


def perturbed_inputs(instance: dict, params: SemanticRobustnessParams) -> list[str]:
    rng = perturb.instance_rng(params.seed, instance["id"])
    return PERTURBATIONS[params.perturbation_type](instance["input"], params.num_perturbations, rng,
                                                   **params.perturbation_kwargs())


def variants(instance: dict, params: SemanticRobustnessParams, model: PromptedModel) -> dict:
    """The model's answers to the instance's perturbed inputs (and, general task, its repeats)."""
    answers = [{"input": text, "output": model.answer(instance, text)} for text in perturbed_inputs(instance, params)]
    result: dict = {"perturbation_type": params.perturbation_type, "perturbed": answers}
    if params.task == "general":
        first = model.answer(instance, instance["input"])
        repeats = [model.answer(instance, instance["input"], sample=1)]
        result["deterministic"] = repeats[0] == first
        if not result["deterministic"]:
            repeats += [model.answer(instance, instance["input"], sample=k)
                        for k in range(2, params.num_baseline_samples)]
        result["original"] = first
        result["repeats"] = repeats
    return result


# --- scores --------------------------------------------------------------------------------

def _words(text: str) -> list[str]:
    """jiwer's default transform: runs of whitespace to one space, stripped, split on spaces."""
    return [w for w in re.sub(r"\s\s+", " ", text).strip().split(" ") if w]


def _distance(reference: list[str], hypothesis: list[str]) -> int:
    """Word-level edit distance: substitutions, deletions and insertions."""
    previous = list(range(len(hypothesis) + 1))
    for i, ref in enumerate(reference, 1):
        current = [i]
        for j, hyp in enumerate(hypothesis, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ref != hyp)))
        previous = current
    return previous[-1]


def word_error_rate(predictions: list[str], references: list[str]) -> float:
    """Corpus WER as HF evaluate's ``wer`` (jiwer) computes it: every pair's edits over every
    reference's words."""
    refs = [_words(r) for r in references]
    total = sum(len(r) for r in refs)
    if total == 0:
        raise MetricError("word_error_rate: the reference answers are empty")
    return sum(_distance(r, _words(p)) for r, p in zip(refs, predictions)) / total


def _mean_delta(original: float | None, perturbed: list[float | None]) -> float | None:
    if original is None or any(p is None for p in perturbed):
        return None
    return float(mean(abs(original - p) for p in perturbed))


def semantic_robustness(instances: list[dict], params: SemanticRobustnessParams,
                        prepared: dict | None = None) -> list[dict | Exception]:
    """Each instance's scores (a batch: its bertscore pairs go through one bert-score pass)."""
    scorer = {"general": _general, "qa": _qa, "summarization": _summarization,
              "classification": _classification}[params.task]
    return scorer(instances, params, prepared)


def _answers(inst: dict) -> list[str]:
    return [a["output"] for a in inst["variants"]["perturbed"]]


def _each(instances: list[dict], score) -> list[dict | Exception]:
    out: list[dict | Exception] = []
    for inst in instances:
        try:
            out.append(score(inst))
        except Exception as exc:  # this item only
            out.append(exc)
    return out


def _general(instances: list[dict], params: SemanticRobustnessParams, prepared) -> list[dict | Exception]:
    def lexical(inst: dict) -> dict:
        original, answers = inst["actual-output"], _answers(inst)
        result = {"word_error_rate": word_error_rate(answers, [original] * len(answers))}
        baseline = _baseline(inst)
        if baseline is not None:
            first, second = zip(*itertools.combinations(baseline, 2))
            result["word_error_rate"] = max(0.0, result["word_error_rate"] - word_error_rate(list(first),
                                                                                              list(second)))
        return result

    results = _each(instances, lexical)
    if params.bertscore:
        _dissimilarities(instances, results, params)
    return results


def _dissimilarities(instances: list[dict], results: list, params: SemanticRobustnessParams) -> None:
    """``bertscore_dissimilarity``: 1 - the mean BERTScore of the perturbed answers against the
    original; less the baseline's, as fmeval computes it: each pair's second answer scored against
    every pair's first answer, the best taken (its BertScore transform with several targets)."""
    from evalq.workers.fmeval.similarity import best_bertscore

    pairs, spans = [], []
    for inst, result in zip(instances, results):
        if not isinstance(result, dict):
            spans.append(None)
            continue
        start = len(pairs)
        pairs += [(a, [inst["actual-output"]]) for a in _answers(inst)]
        middle = len(pairs)
        baseline = _baseline(inst)
        if baseline is not None:
            first, second = zip(*itertools.combinations(baseline, 2))
            pairs += [(answer, list(first)) for answer in second]
        spans.append((start, middle, len(pairs)))
    scores = best_bertscore(pairs, params) if pairs else []
    for result, span in zip(results, spans):
        if span is None:
            continue
        start, middle, stop = span
        if any(s is None for s in scores[start:stop]):
            result["bertscore_dissimilarity"] = None
            continue
        dissimilarity = 1 - mean(scores[start:middle])
        if stop > middle:
            dissimilarity = max(0.0, dissimilarity - (1 - mean(scores[middle:stop])))
        result["bertscore_dissimilarity"] = dissimilarity


def _baseline(inst: dict) -> list[str] | None:
    """fmeval's baseline answers, for a model that answered one input twice differently: the
    repeats and the instance's own output (None for a deterministic model)."""
    v = inst["variants"]
    if v.get("deterministic", True):
        return None
    return list(v["repeats"]) + [inst["actual-output"]]


def _task_deltas(instances: list[dict], score_one, names: list[str]) -> list[dict | Exception]:
    """fmeval's task forms: the scores of the original answer, and ``delta_<score>``, the mean
    absolute change of each over the perturbed answers."""
    def one(inst: dict) -> dict:
        original = score_one(inst, inst["actual-output"])
        perturbed = [score_one(inst, answer) for answer in _answers(inst)]
        out = {name: original[name] for name in names}
        out.update({f"delta_{name}": _mean_delta(original[name], [p[name] for p in perturbed]) for name in names})
        return out
    return _each(instances, one)


def _targets(inst: dict, params: SemanticRobustnessParams) -> list[str]:
    from evalq.workers.fmeval.text import targets

    return targets(inst, params)


def _qa(instances, params, prepared):
    from evalq.workers.fmeval.text import QA_SCORES, qa_scores

    names = list(QA_SCORES)
    results = _task_deltas(instances, lambda inst, answer: qa_scores(answer, _targets(inst, params)), names)
    if params.bertscore:
        _bertscore_deltas(instances, results, params)
    return results


def _summarization(instances, params, prepared):
    from evalq.workers.fmeval.summarization import lexical_scores

    results = _task_deltas(instances, lambda inst, answer: lexical_scores(answer, _targets(inst, params), params),
                           ["meteor", "rouge"])
    if params.bertscore:
        _bertscore_deltas(instances, results, params)
    return results


def _bertscore_deltas(instances: list[dict], results: list, params: SemanticRobustnessParams) -> None:
    """``bertscore`` of the original answer against the targets and its ``delta_bertscore``."""
    from evalq.workers.fmeval.similarity import best_bertscore

    pairs, spans = [], []
    for inst, result in zip(instances, results):
        if not isinstance(result, dict):
            spans.append(None)
            continue
        found = _targets(inst, params)
        start = len(pairs)
        pairs += [(answer, found) for answer in [inst["actual-output"], *_answers(inst)]]
        spans.append((start, len(pairs)))
    scores = best_bertscore(pairs, params) if pairs else []
    for result, span in zip(results, spans):
        if span is not None:
            original, *perturbed = scores[span[0]:span[1]]
            result["bertscore"] = original
            result["delta_bertscore"] = _mean_delta(original, perturbed)


def _classification(instances, params, prepared):
    from evalq.shared.fmeval.classification import convert

    def score(inst: dict, answer: str) -> dict:
        refs = inst["expected-output"]
        if len(refs) != 1:
            raise MetricError(f"expected one target label, got {len(refs)} references")
        return {"classification_accuracy_score": int(convert(answer, prepared["labels"]) == refs[0])}

    return _task_deltas(instances, score, ["classification_accuracy_score"])
