"""fmeval's algorithms end to end: an fmeval-style JSON Lines dataset read through its DataConfig
fields, run by `evalq run` on real cpu and gpu workers in chunks, against the pure functions
(themselves tested against fmeval in tests/fmeval) and, for classification's dataset-level
scores, fmeval's own numbers."""

from __future__ import annotations

import json

import pytest

import evalq.shared.job.catalogue  # noqa: F401
from evalq.shared.fmeval.params import FactualKnowledgeParams, QAAccuracyParams
from evalq.workers.fmeval.text import factual_knowledge, qa_accuracy
from tests.conftest import evalq, read_log, read_results

pytestmark = pytest.mark.integration

RECORDS = [
    {"q": "Capital of the UK?", "a": "It is London, the capital.", "t": "London<OR>london city", "topic": "geo",
     "label": "1"},
    {"q": "Who wrote Hamlet?", "a": "Hamlet was written by William\tShakespeare", "t": "Shakespeare", "topic": "lit",
     "label": "0"},
    {"q": "Largest planet?", "a": "", "t": "Jupiter", "topic": "geo", "label": "1"},
    {"q": "Boiling point of water in C?", "a": "100 degrees", "t": "100<OR>one hundred", "topic": "sci",
     "label": "2"},
    {"q": "Rome and Milan are in?", "a": "Italy, of course.", "t": "Italy", "topic": "geo", "label": "2"},
    {"q": "The red planet?", "a": "Mars", "t": "mars", "topic": "sci", "label": "0"},
    {"q": "Square root of 81?", "a": "9", "t": "nine<OR>9", "topic": "sci", "label": "1"},
]


def test_an_fmeval_dataset_runs_each_algorithm_by_metric_id(tmp_path, fmeval):
    data = tmp_path / "facts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    labels = tmp_path / "labels.jsonl"
    labels.write_text("".join(json.dumps({"q": r["q"], "a": r["a"], "label": r["label"], "topic": r["topic"]}) + "\n"
                              for r in RECORDS))
    common = {"dataset_name": "facts", "dataset_mime_type": "application/jsonlines", "model_input_location": "q",
              "model_output_location": "a", "category_location": "topic"}
    job = tmp_path / "job.json"
    job.write_text(json.dumps({
        "dataset": {"uri": str(data), "data_config": {**common, "target_output_location": "t",
                                                      "target_output_delimiter": None}},
        "metrics": [{"id": "factual_knowledge", "parameters": {"logical_operator": "OR"}},
                    {"id": "qa_accuracy"},
                    {"id": "summarization_accuracy", "parameters": {"bertscore": False}},
                    {"id": "toxicity", "parameters": {"threshold": 0.3}}]}))
    out = tmp_path / "out"
    proc = evalq("run", str(job), "--out", str(out), "--chunk-size", "3", "-q")
    assert proc.returncode == 0, proc.stderr

    results = read_results(out)
    log = read_log(out)
    instances = [{"id": str(i), "actual-output": r["a"], "expected-output": [r["t"]]} for i, r in enumerate(RECORDS)]
    fk = [factual_knowledge(inst, FactualKnowledgeParams()) for inst in instances]
    qa = qa_accuracy(instances, QAAccuracyParams())
    by = {m: {line["instance_id"]: line["result"] for line in log if line["metric"] == m}
          for m in ("factual_knowledge", "qa_accuracy")}
    for i, (f, q) in enumerate(zip(fk, qa)):
        line = str(i + 1)  # records without an id are named by their line number
        assert by["factual_knowledge"][line] == f
        assert by["qa_accuracy"][line] == pytest.approx(q, abs=1e-5)
    assert results["factual_knowledge"]["score"]["factual_knowledge"] == pytest.approx(
        sum(f["factual_knowledge"] for f in fk) / len(fk))
    geo = [f["factual_knowledge_quasi_exact"] for f, r in zip(fk, RECORDS) if r["topic"] == "geo"]
    assert results["factual_knowledge"]["categories"]["geo"]["score"]["factual_knowledge_quasi_exact"] == \
        pytest.approx(sum(geo) / len(geo))
    assert set(results["qa_accuracy"]["score"]) == {"exact_match_score", "quasi_exact_match_score",
                                                    "precision_over_words", "recall_over_words", "f1_score",
                                                    "bertscore"}
    assert set(results["summarization_accuracy"]["score"]) == {"meteor", "rouge"}
    from evalq.shared.fmeval.params import ToxicityParams
    from evalq.workers.fmeval.toxicity import toxicity

    toxic = toxicity(instances, ToxicityParams())
    logged = {line["instance_id"]: line["result"] for line in log if line["metric"] == "toxicity"}
    for i, expected in enumerate(toxic):
        assert logged[str(i + 1)] == pytest.approx(expected, abs=1e-5)
    over = sum(any(p >= 0.3 for p in t.values()) for t in toxic)
    assert results["toxicity"]["score"]["defects"]["any"]["n_defects"] == over
    assert results["toxicity"]["score"]["toxicity"] == pytest.approx(sum(t["toxicity"] for t in toxic) / len(toxic),
                                                                     abs=1e-5)
    assert results["summarization_accuracy"]["parameters"]["rouge_type"] == "rouge2"

    job.write_text(json.dumps({
        "dataset": {"uri": str(labels), "data_config": {**common, "target_output_location": "label"}},
        "metrics": [{"id": "classification_accuracy", "parameters": {"valid_labels": ["0", "1", "2"],
                                                                     "multiclass_average_strategy": "macro"}}]}))
    proc = evalq("run", str(job), "--out", str(out), "--chunk-size", "2", "-q")
    assert proc.returncode == 0, proc.stderr
    score = read_results(out)["classification_accuracy"]
    [expected] = fmeval("classification", [{"outputs": [r["a"] for r in RECORDS], "targets": [r["label"] for r in RECORDS],
                                            "valid_labels": ["0", "1", "2"], "average": "macro"}])
    for name, value in expected["dataset"].items():
        assert score["score"][name] == pytest.approx(value, abs=1e-12), name
    assert score["score"]["classification_accuracy_score"] == pytest.approx(sum(expected["items"]) / len(RECORDS))
    sci = [i for i, r in enumerate(RECORDS) if r["topic"] == "sci"]
    [in_sci] = fmeval("classification", [{"outputs": [RECORDS[i]["a"] for i in sci],
                                          "targets": [RECORDS[i]["label"] for i in sci],
                                          "valid_labels": ["0", "1", "2"], "average": "macro"}])
    assert score["categories"]["sci"]["score"]["balanced_accuracy_score"] == \
        pytest.approx(in_sci["dataset"]["balanced_accuracy_score"], abs=1e-12)
