"""A HarpIA job that lists metrics several times with different parameters and
no ``name`` runs unchanged: one results.json object per enabled entry in job
order, one log line per (instance, entry), each value equal to the reference
library run directly with that entry's parameters (nltk, rouge-score,
bert-score; for the judge, the scores judge-sim was told to give)."""

from __future__ import annotations

import functools
import json
import uuid

import pytest

from evalq.sim import JudgeSim, Region
from tests.conftest import evalq, read_log

pytestmark = pytest.mark.integration

SECRET = "sk-evalq-repeat-" + uuid.uuid4().hex
KEY_ENV = "TEST_REPEAT_API_KEY"

TEXTS = [
    ("The cat is sleeping on the sofa.", ["The cat sleeps on the couch.", "A cat is asleep on the sofa."]),
    ("I like reading books at night.", ["I enjoy reading books in the evening."]),
    ("Where is the train station?", ["Where can I find the railway station?", "Train station, where?"]),
    ("She finished the report yesterday.", ["She finished the report yesterday."]),
    ("It rained a lot overnight in the city.", ["It rained heavily during the night in the city."]),
]
SCORES = [1, 3, 4, 5, 2]  # what judge-sim is told to give each instance
INSTANCES = [{"id": f"i{n}", "input": f"Question {n}? [[sim:score={s}]] {uuid.uuid4().hex}",
              "actual-output": out, "expected-output": refs}
             for n, ((out, refs), s) in enumerate(zip(TEXTS, SCORES))]

BLEU_A = {"weights": [0.25, 0.25, 0.25, 0.25], "smoothing_function": "method1"}
BLEU_B = {"weights": [0.5, 0.5], "smoothing_function": "method3", "auto_reweigh": True}
ROUGE_A = {"rouge_types": ["rouge1", "rougeL"]}
ROUGE_B = {"rouge_types": ["rouge2", "rougeLsum"], "use_stemmer": True}


def _job(sim) -> dict:
    return {
        "instances": INSTANCES,
        "judges": {"sim": {"provider": "openai", "model": "judge-sim", "api_key_env": KEY_ENV,
                           "max_tokens": 100, "max_retries": 1, "timeout": 5,
                           "deployments": [{"region": "lab", "base_url": sim.base_url("lab"),
                                            "tpm": 10_000_000, "rpm": 100_000}]}},
        "judging": {"cache": False},
        "metrics": [
            {"id": "bleu", "enable": True, "parameters": BLEU_A},
            {"id": "rouge", "enable": True, "parameters": ROUGE_A},
            {"id": "bleu", "enable": True, "parameters": BLEU_B},
            {"id": "bleu", "enable": False, "parameters": {"weights": [1]}},
            {"id": "bertscore", "parameters": {"batch_size": 4}},
            {"id": "coherence", "parameters": {"judge": "sim", "threshold": 3}},
            {"id": "rouge", "parameters": ROUGE_B},
            {"id": "bertscore", "parameters": {"batch_size": 4, "idf": True}},
            {"id": "coherence", "name": "coherence_strict", "parameters": {"judge": "sim", "threshold": 5}},
        ],
    }


def _bleu(params: dict) -> list[float]:
    from nltk.tokenize import wordpunct_tokenize as tok
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    smoothing = getattr(SmoothingFunction(), params["smoothing_function"])
    return [sentence_bleu([tok(r) for r in refs], tok(out), weights=params["weights"],
                          smoothing_function=smoothing, auto_reweigh=params.get("auto_reweigh", False))
            for out, refs in TEXTS]


def _rouge(params: dict) -> list[dict]:
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(params["rouge_types"], use_stemmer=params.get("use_stemmer", False))
    return [scorer.score_multi(refs, out) for out, refs in TEXTS]


@functools.lru_cache(maxsize=2)
def _bertscore(idf: bool) -> list[float]:
    from bert_score import BERTScorer

    from evalq.shared.metrics.bertscore import BUNDLED_NUM_LAYERS, bundled_model_dir

    refs = [refs for _, refs in TEXTS]
    extra = {"idf": True, "idf_sents": [r for group in refs for r in group]} if idf else {}
    # nthreads=0: idf without a forked pool (a fork after torch started its threads can hang)
    scorer = BERTScorer(model_type=bundled_model_dir(), num_layers=BUNDLED_NUM_LAYERS, device="cpu",
                        nthreads=0, **extra)
    return scorer.score([out for out, _ in TEXTS], refs)[2].tolist()


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """One `evalq run` of the job file, as a user runs it (embedded Redis and workers)."""
    tmp = tmp_path_factory.mktemp("repeated")
    with JudgeSim([Region("lab")], api_key=SECRET) as sim:
        job = tmp / "job.json"
        job.write_text(json.dumps(_job(sim)))
        proc = evalq("run", str(job), "--out", str(tmp / "out"), "--concurrency", "1", "-q",
                     env={KEY_ENV: SECRET})
    assert proc.returncode == 0, proc.stderr
    return json.loads((tmp / "out" / "results.json").read_text()), read_log(tmp / "out")


def test_one_result_per_enabled_entry_in_job_order(ran):
    results, log = ran
    assert [(r["metric"], r.get("name")) for r in results] == [
        ("bleu", None), ("rouge", None), ("bleu", None), ("bertscore", None), ("coherence", None),
        ("rouge", None), ("bertscore", None), ("coherence", "coherence_strict")]
    assert ["name" in r for r in results] == [False] * 7 + [True]
    assert results[0]["parameters"] == {**BLEU_A, "auto_reweigh": False}
    assert results[2]["parameters"] == {"weights": [0.5, 0.5], "smoothing_function": "method3", "auto_reweigh": True}
    assert [r["parameters"]["idf"] for r in results if r["metric"] == "bertscore"] == [False, True]
    assert all(r["n"] == len(INSTANCES) and r["n_errors"] == 0 for r in results), results
    # one line per (instance, entry), entry by entry, each naming its entry by its position and, as
    # HarpIA's log does, by its parameters as run (the same as results.json's)
    assert len(log) == len(results) * len(INSTANCES)
    for k, result in enumerate(results):
        lines = log[k * len(INSTANCES):(k + 1) * len(INSTANCES)]
        assert [line["instance_id"] for line in lines] == [i["id"] for i in INSTANCES]
        assert all(line["metric"] == result["metric"] and line["entry"] == k
                   and line["parameters"] == result["parameters"]
                   and line.get("name") == result.get("name") for line in lines)


def _lines(ran: tuple[list[dict], list[dict]], metric: str, **params) -> list[dict]:
    """The log lines of the entry with these parameters (found in results.json by the line's ``entry``)."""
    results, log = ran
    return [line for line in log if line["metric"] == metric
            and all(results[line["entry"]]["parameters"][k] == v for k, v in params.items())]


def test_each_bleu_equals_nltk_with_its_parameters(ran):
    results, log = ran
    for params, result in ((BLEU_A, results[0]), (BLEU_B, results[2])):
        expected = _bleu(params)
        got = [line["result"] for line in _lines(ran, "bleu", weights=[float(w) for w in params["weights"]])]
        assert got == pytest.approx(expected, abs=1e-12)
        assert result["score"] == pytest.approx(sum(expected) / len(expected), abs=1e-12)
    assert _bleu(BLEU_A) != pytest.approx(_bleu(BLEU_B))  # the two entries really differ


def test_each_rouge_equals_rouge_score_with_its_parameters(ran):
    results, log = ran
    for params, result in ((ROUGE_A, results[1]), (ROUGE_B, results[5])):
        expected = _rouge(params)
        lines = _lines(ran, "rouge", rouge_types=params["rouge_types"])
        assert len(lines) == len(INSTANCES)
        for line, ref in zip(lines, expected):
            for rtype in params["rouge_types"]:
                assert line["result"][rtype] == pytest.approx(ref[rtype].fmeasure, abs=1e-12)
                assert line["result"][f"{rtype}_precision"] == pytest.approx(ref[rtype].precision, abs=1e-12)
        mean = sum(e[params["rouge_types"][0]].fmeasure for e in expected) / len(expected)
        assert result["score"][params["rouge_types"][0]] == pytest.approx(mean, abs=1e-12)


def test_bertscore_with_and_without_idf_equals_bert_score(ran):
    results, log = ran
    for idf, result in ((False, results[3]), (True, results[6])):
        expected = _bertscore(idf)
        got = [line["result"]["f1"] for line in _lines(ran, "bertscore", idf=idf)]
        assert got == pytest.approx(expected, abs=1e-4)
        assert result["score"]["f1"] == pytest.approx(sum(expected) / len(expected), abs=1e-4)
    assert _bertscore(False) != pytest.approx(_bertscore(True), abs=1e-3)


def test_judge_metric_twice_with_different_thresholds(ran):
    results, log = ran
    for threshold, result in ((3, results[4]), (5, results[7])):
        lines = _lines(ran, "coherence", threshold=threshold)
        assert [line["result"]["score"] for line in lines] == SCORES
        assert result["score"]["mean"] == pytest.approx(sum(SCORES) / len(SCORES))
        assert result["score"]["pass_rate"] == pytest.approx(sum(s >= threshold for s in SCORES) / len(SCORES))
        assert result["judge"]["calls"] == len(INSTANCES)
