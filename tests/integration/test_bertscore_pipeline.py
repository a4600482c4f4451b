"""bertscore end to end: `evalq run` in embedded mode with a gpu-queue worker
(on CPU here), validation through the CLI, and the gpu worker's pool."""

from __future__ import annotations

import uuid

import pytest

from tests.conftest import evalq, read_log, read_results, start_worker, stop_worker, wait_for_worker, write_job

pytestmark = pytest.mark.integration

INSTANCES = [
    {"id": "1", "input": "q", "actual-output": "The cat is sleeping on the sofa.",
     "expected-output": ["The cat sleeps on the couch.", "A cat is asleep on the sofa."]},
    {"id": "2", "input": "q", "actual-output": "I like reading books at night.",
     "expected-output": ["I enjoy reading in the evening."]},
    {"id": "3", "input": "q", "actual-output": "",
     "expected-output": ["Nothing was said."]},
    {"id": "4", "input": "q", "actual-output": "Where is the train station?",
     "expected-output": ["Where can I find the railway station?", "Train station, where?"]},
    {"id": "5", "input": "q", "actual-output": "She finished report yesterday.",
     "expected-output": ["She finished the report yesterday."]},
    {"id": "6", "input": "q", "actual-output": "It rained a lot overnight.",
     "expected-output": ["It rained heavily during the night.", "There was a lot of rain last night."]},
    {"id": "7", "input": "q", "actual-output": "The meeting was postponed until tomorrow.",
     "expected-output": ["Stock prices fell sharply today.", "The meeting has been moved to tomorrow."]},
]


def test_embedded_run_mixes_cpu_and_gpu_metrics(tmp_path):
    job = write_job(tmp_path / "job.json", INSTANCES, [
        {"id": "bleu", "parameters": {"weights": [0.5, 0.5], "smoothing_function": "method1"}},
        {"id": "bertscore", "parameters": {"batch_size": 4}},
        {"id": "bertscore", "name": "bertscore_idf", "parameters": {"idf": True, "batch_size": 4}},
    ])
    out = tmp_path / "out"
    # chunks of 3: the idf weights must still be the whole reference set's
    proc = evalq("run", str(job), "--out", str(out), "--chunk-size", "3", "--concurrency", "1", "-q")
    assert proc.returncode == 0, proc.stderr
    results = read_results(out)
    assert set(results) == {"bleu", "bertscore", "bertscore_idf"}
    assert all(m["n"] == len(INSTANCES) and m["n_errors"] == 0 for m in results.values())

    from bert_score import BERTScorer

    from evalq.shared.metrics.bertscore import BUNDLED_NUM_LAYERS, bundled_model_dir

    cands = [i["actual-output"] for i in INSTANCES]
    refs = [i["expected-output"] for i in INSTANCES]
    kw = dict(model_type=bundled_model_dir(), num_layers=BUNDLED_NUM_LAYERS, device="cpu", nthreads=0)
    scorer = BERTScorer(**kw)
    cands_ok = [c for c in cands if c]
    refs_ok = [r for c, r in zip(cands, refs) if c]
    expected = {
        "bertscore": [t.tolist() for t in scorer.score(cands_ok, refs_ok)],
        "bertscore_idf": [t.tolist() for t in BERTScorer(
            **kw, idf=True, idf_sents=[r for group in refs for r in group]).score(cands_ok, refs_ok)],
    }
    log = read_log(out)
    assert len(log) == 3 * len(INSTANCES)
    for key, (P, R, F) in expected.items():
        lines = [line for line in log if line.get("name", line["metric"]) == key]
        assert [line["instance_id"] for line in lines] == [i["id"] for i in INSTANCES]
        assert lines[2]["result"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0}  # empty candidate
        scored = [line["result"] for line in lines if line["instance_id"] != "3"]
        assert [s["precision"] for s in scored] == pytest.approx(P, abs=1e-4)
        assert [s["recall"] for s in scored] == pytest.approx(R, abs=1e-4)
        assert [s["f1"] for s in scored] == pytest.approx(F, abs=1e-4)
        score = results[key]["score"]
        assert score["f1"] == pytest.approx(sum(F) / len(INSTANCES), abs=1e-4)
        dist = score["distribution"]["f1"]
        assert dist["min"] == 0.0 and dist["max"] == pytest.approx(max(F), abs=1e-4)
        assert sum(dist["histogram"]["counts"]) == len(INSTANCES)
    assert results["bertscore_idf"]["parameters"]["idf"] is True
    assert expected["bertscore"][2] != pytest.approx(expected["bertscore_idf"][2], abs=1e-3)


@pytest.mark.parametrize("command,params,fragment", [
    ("run", {"num_layer": 5}, "unknown parameter 'num_layer'; did you mean 'num_layers'?"),
    ("run", {"model_type": "nobody/no-such-model"}, "model_type: model 'nobody/no-such-model' not found"),
    ("validate", {"model_type": "nobody/no-such-model"}, "never downloads models"),
    ("validate", {"rescale_with_baseline": True, "lang": "en", "model_type": "all-MiniLM-L6-v2"},
     "bert-score ships no baseline"),
])
def test_invalid_bertscore_parameters_exit_2(tmp_path, command, params, fragment):
    job = write_job(tmp_path / "job.json", INSTANCES, [{"id": "bertscore", "parameters": params}])
    proc = evalq(command, str(job), "--out", str(tmp_path / "out")) if command == "run" else \
        evalq(command, str(job))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"error: {job}: metrics[0] (bertscore).parameters: " in proc.stderr
    assert fragment in proc.stderr
    assert not (tmp_path / "out").exists()


def test_gpu_worker_is_solo_and_prefetches_one(redis_url, tmp_path):
    from evalq.orchestrator.app import client_app

    name = f"gpu{uuid.uuid4().hex[:6]}"
    proc = start_worker(redis_url, "gpu", tmp_path, concurrency=4, name=name)
    try:
        wait_for_worker(redis_url, name)
        replies = client_app(redis_url).control.inspect(timeout=2.0).stats() or {}
        stats = next(v for k, v in replies.items() if k.startswith(name))
        assert stats["pool"]["implementation"].endswith("solo:TaskPool")
        assert stats["prefetch_count"] == 1
    finally:
        stop_worker(proc)
