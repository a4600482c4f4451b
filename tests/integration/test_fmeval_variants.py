"""Variants as a stage of the pipeline: the model under test answers each instance's perturbed
inputs on its own queue (generate.<region> under its budget, or generate.local for a runner
class), the answers are kept and logged, and semantic_robustness scores them on cpu/gpu. A
generation worker killed mid-job leaves every variant recorded once."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import uuid

import pytest
import redis

from evalq.cli.run import run_job
from evalq.shared.cluster import keys
from evalq.shared.fmeval.params import SemanticRobustnessParams
from evalq.shared.job.schema import parse_job
from evalq.sim import JudgeSim, Region
from evalq.workers.fmeval.robustness import perturbed_inputs, semantic_robustness
from tests.conftest import evalq, read_log, read_results, start_worker, stop_worker, wait_for_worker, write_job

pytestmark = pytest.mark.integration

QUESTIONS = ["What is the capital of France?", "Name a prime number above ten.", "Who wrote Hamlet?",
             "How many legs does a spider have?", "What colour is the sky on a clear day?"]


def variant_lines(log: list[dict]) -> dict[str, dict]:
    lines = [line for line in log if line.get("stage") == "variants"]
    by_id = {line["instance_id"]: line for line in lines}
    assert len(by_id) == len(lines), "an instance's variants were logged twice"
    return by_id


def test_an_endpoint_model_answers_the_variants_under_its_budget(tmp_path):
    records = [{"id": f"q{i}", "question": q, "answer": f"Answer {i}"} for i, q in enumerate(QUESTIONS)]
    data = tmp_path / "qs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    key_env = "TEST_ROBUST_API_KEY"
    with JudgeSim([Region("lab", tpm=200_000, rpm=600)], api_key="k", per_request=True) as sim:
        model = {"provider": "openai", "model": "m", "api_key_env": key_env, "max_tokens": 40,
                 "prompt_template": "Answer briefly: $model_input",
                 "deployments": [{"region": "lab", "base_url": sim.base_url("lab"), "tpm": 200_000, "rpm": 600}]}
        job = write_job(tmp_path / "job.json", [], [])
        job.write_text(json.dumps({
            "dataset": {"uri": str(data), "data_config": {"id_location": "id", "model_input_location": "question"}},
            "model": model,
            "metrics": [{"id": "semantic_robustness", "parameters": {"num_perturbations": 3, "bertscore": False}}]}))
        out = tmp_path / "out"
        proc = evalq("run", str(job), "--out", str(out), "--chunk-size", "2",
                     env={key_env: "k", "EVALQ_CACHE_DIR": str(tmp_path / "cache"), "EVALQ_PROGRESS_EVERY": "0.1"})
        assert proc.returncode == 0, proc.stderr
        stats, answered = sim.stats()["lab"], sim.answered()
    # progress counts what the cluster records, the variants' run too (issue 74: `make demo` showed
    # 36/30 items): the generated answers, the variants and the scores, 5 each, never past the total
    shown = [tuple(map(int, m)) for m in re.findall(r"([\d,]+)/([\d,]+) items", proc.stderr.replace(",", ""))]
    assert shown and all(done <= total == 3 * len(records) for done, total in shown), proc.stderr
    assert shown[-1] == (15, 15), proc.stderr
    log = read_log(out)
    generated = {line["instance_id"]: line["result"]["output"] for line in log if line["metric"] == "generate"}
    variants = variant_lines(log)
    assert set(variants) == set(generated) == {r["id"] for r in records}
    params = SemanticRobustnessParams(num_perturbations=3, bertscore=False)
    instances = []
    for r in records:
        v = variants[r["id"]]
        assert v["metric"] == "semantic_robustness" and v["variants_for"] == 0 and "entry" not in v
        inst = {"id": r["id"], "input": r["question"], "actual-output": generated[r["id"]]}
        assert [a["input"] for a in v["result"]["perturbed"]] == perturbed_inputs(inst, params)
        instances.append({**inst, "variants": v["result"]})
    # a reader recomputes every score from the log
    expected = semantic_robustness(instances, params)
    scores = {line["instance_id"]: line["result"] for line in log if line["metric"] == "semantic_robustness"
              and "stage" not in line}
    assert [scores[i["id"]] for i in instances] == expected
    results = read_results(out)["semantic_robustness"]
    assert results["n"] == len(records) and results["n_errors"] == 0
    cost = results["variants"]["judge"]
    # per item: 3 perturbed inputs, the original input, one repeat (judge-sim is deterministic); the
    # original input's request is the generation stage's: answered once, the other from the cache
    assert cost["calls"] + cost["cache_hits"] + cost["reused"] == len(records) * 5
    # paid for exactly what the job must ask: each question's prompt twice (the generation's request, which
    # the variants' unperturbed input shares, and the one repeat), each other perturbed prompt once; never a
    # request twice because two runs asked it at the same moment
    must: dict[str, int] = {}
    for r in records:
        must[r["question"]] = 2
        for text in perturbed_inputs({"id": r["id"], "input": r["question"]}, params):
            must.setdefault(text, 1)
    assert sorted(answered.values()) == sorted(must.values())
    assert stats["ok"] == sum(must.values())


def test_a_killed_generation_worker_leaves_every_variant_once(tmp_path):
    from evalq.cli.embedded import EmbeddedRedis

    server = EmbeddedRedis(tmp_path)
    server.start()
    url = server.url
    env = {"EVALQ_VISIBILITY_TIMEOUT": "3"}
    logs = tmp_path / "logs"
    logs.mkdir()
    names = [f"g{uuid.uuid4().hex[:4]}", f"h{uuid.uuid4().hex[:4]}", f"c{uuid.uuid4().hex[:4]}"]
    workers = [start_worker(url, "generate.local", logs, concurrency=2, env=env, name=names[0]),
               start_worker(url, "generate.local", logs, concurrency=2, env=env, name=names[1]),
               start_worker(url, "cpu", logs, concurrency=2, env=env, name=names[2])]
    try:
        for n in names:
            wait_for_worker(url, n)
        instances = [{"id": f"x{i}", "input": f"Question number {i}: what is {i} plus {i}?",
                      "actual-output": f"question number {i}: what is {i} plus {i}?"} for i in range(40)]
        job = parse_job({"instances": instances,
                         "model": {"runner": "tests.plugins.echo_runner:SlowLowerRunner",
                                   "parameters": {"seconds": 0.02}},
                         "metrics": [{"id": "semantic_robustness",
                                      "parameters": {"num_perturbations": 4, "bertscore": False,
                                                     "perturbation_type": "random_upper_case"}}]})
        box: dict = {}
        thread = threading.Thread(target=lambda: box.update(
            summary=run_job(job, tmp_path / "out", broker=url, progress=False, stall_timeout=120)), daemon=True)
        thread.start()
        r = redis.Redis.from_url(url)
        deadline = time.monotonic() + 60
        while not any(r.hlen(k) >= 6 for k in r.scan_iter(match=f"{keys.PREFIX}:*:res:*variants")):
            assert time.monotonic() < deadline, "no variants were recorded"
            time.sleep(0.02)
        os.killpg(workers[0].pid, signal.SIGKILL)
        thread.join(timeout=180)
        assert not thread.is_alive(), "the job did not finish after the kill"
    finally:
        for w in workers:
            stop_worker(w)
        server.stop()
    log = read_log(tmp_path / "out")
    variants = variant_lines(log)
    assert sorted(variants) == sorted(i["id"] for i in instances)
    params = SemanticRobustnessParams(num_perturbations=4, bertscore=False, perturbation_type="random_upper_case")
    for inst in instances:
        v = variants[inst["id"]]["result"]
        assert [a["input"] for a in v["perturbed"]] == perturbed_inputs(inst, params)
        # the runner answers with the prompt lower-cased: every answer is the unperturbed output
        assert all(a["output"] == inst["actual-output"] for a in v["perturbed"])
    results = read_results(tmp_path / "out")["semantic_robustness"]
    assert (results["n"], results["n_errors"]) == (len(instances), 0)
    assert results["score"]["word_error_rate"] == 0.0
