"""Datasets from local files and a real S3 API (moto in server mode, on loopback),
outputs to S3, per-category results, and the model under test (judge-sim and a
Python ModelRunner) generating outputs before the metrics run."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import time
import uuid

import pytest
import requests

from evalq.cli.embedded import free_port
from evalq.sim import JudgeSim, Region
from tests.conftest import ROOT, evalq, read_log, read_results

pytestmark = pytest.mark.integration

AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def start_moto(env: dict | None = None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            requests.get(url, timeout=5)
            return proc, url
        except (requests.ConnectionError, requests.Timeout):  # not up yet, or its first answer slow
            time.sleep(0.1)
    proc.kill()
    raise TimeoutError("moto server did not start")


@pytest.fixture(scope="module")
def s3():
    """A real S3 API on loopback; yields (endpoint_url, boto3 client)."""
    import boto3

    for k, v in AWS.items():
        os.environ.setdefault(k, v)
    proc, url = start_moto()
    client = boto3.client("s3", endpoint_url=url, **{k.lower(): v for k, v in AWS.items()
                                                     if k != "AWS_DEFAULT_REGION"}, region_name="us-east-1")
    client.create_bucket(Bucket="evals")
    yield url, client
    proc.terminate()
    proc.wait(10)


def jsonl(records, compress=False) -> bytes:
    data = "".join(json.dumps(r) + "\n" for r in records).encode()
    return gzip.compress(data) if compress else data


QA = [{"question": f"Question {i}?", "answer": ans, "ground_truth": gt, "meta": {"category": cat}}
      for i, (ans, gt, cat) in enumerate([
          ("Paris, France.", "Paris city <OR> paris, France", "geo"), ("The cat sat", "the cat sat on the mat", "text"),
          ("Berlin", "Bonn", "geo"), ("A dog ran", "the dog ran home", "text"), ("Rome", "Rome", "geo")])]


def write_job(tmp_path, job: dict):
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    return path


@pytest.mark.parametrize("key,compress", [("qa/plain.jsonl", False), ("qa/packed.jsonl.gz", True)])
def test_s3_dataset_in_results_to_s3_out(s3, tmp_path, key, compress):
    url, client = s3
    client.put_object(Bucket="evals", Key=key, Body=jsonl(QA, compress))
    prefix = f"results/{uuid.uuid4().hex}/"
    job = write_job(tmp_path, {
        "dataset": {"uri": f"s3://evals/{key}", "endpoint_url": url,
                    "data_config": {"preset": "azure_qa", "category_location": "meta.category"}},
        "metrics": [{"id": "exact_match"}, {"id": "rouge", "parameters": {"rouge_types": ["rouge1"]}}]})
    proc = evalq("run", str(job), "--out", f"s3://evals/{prefix}", "-q", env=AWS)
    assert proc.returncode == 0, proc.stderr
    listed = {o["Key"] for o in client.list_objects_v2(Bucket="evals", Prefix=prefix)["Contents"]}
    assert listed == {prefix + name for name in ("results.json", "log.jsonl", "run.json", "report.html")}

    def get(name):
        return client.get_object(Bucket="evals", Key=prefix + name)["Body"].read().decode()

    results = {m["metric"]: m for m in json.loads(get("results.json"))}
    log = [json.loads(line) for line in get("log.jsonl").splitlines()]
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rouge1"])
    expected_rouge = {}
    for i, rec in enumerate(QA):
        refs = [r.strip() for r in rec["ground_truth"].split("<OR>")]
        best = max(scorer.score(ref, rec["answer"])["rouge1"].fmeasure for ref in refs)
        expected_rouge[str(i + 1)] = (best, rec["meta"]["category"])
    rouge_lines = {line["instance_id"]: line for line in log if line["metric"] == "rouge"}
    for iid, (value, category) in expected_rouge.items():
        assert rouge_lines[iid]["result"]["rouge1"] == pytest.approx(value)
        assert rouge_lines[iid]["category"] == category
    em = results["exact_match"]
    assert em["score"] == pytest.approx(2 / 5)  # the first matches the second <OR> alternative
    assert em["categories"]["geo"] == {"score": pytest.approx(2 / 3), "n": 3, "n_errors": 0}
    assert em["categories"]["text"] == {"score": 0.0, "n": 2, "n_errors": 0}
    for cat in ("geo", "text"):
        values = [v for v, c in expected_rouge.values() if c == cat]
        assert results["rouge"]["categories"][cat]["score"]["rouge1"] == pytest.approx(sum(values) / len(values))
    run = json.loads(get("run.json"))
    assert run["dataset"]["uri"] == f"s3://evals/{key}" and run["n_instances"] == 5


def test_missing_object_and_bucket_are_clear_errors(s3, tmp_path):
    url, client = s3
    job = write_job(tmp_path, {"dataset": {"uri": "s3://evals/nope/missing.jsonl", "endpoint_url": url},
                               "metrics": [{"id": "exact_match"}]})
    proc = evalq("validate", str(job), env=AWS)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "s3://evals/nope/missing.jsonl: no such object" in proc.stderr
    client.put_object(Bucket="evals", Key="ok.jsonl", Body=jsonl(QA))
    job = write_job(tmp_path, {"dataset": {"uri": "s3://evals/ok.jsonl", "endpoint_url": url},
                               "output": {"uri": "s3://no-such-bucket/out/", "endpoint_url": url},
                               "metrics": [{"id": "exact_match"}]})
    proc = evalq("run", str(job), "-q", env=AWS)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "s3://no-such-bucket: no such bucket" in proc.stderr


def test_denied_credentials_are_a_clear_error(tmp_path):
    proc, url = start_moto({"INITIAL_NO_AUTH_ACTION_COUNT": "0"})  # this server checks every key
    try:
        job = write_job(tmp_path, {"dataset": {"uri": "s3://evals/qa.jsonl", "endpoint_url": url},
                                   "metrics": [{"id": "exact_match"}]})
        result = evalq("validate", str(job), env={**AWS, "AWS_ACCESS_KEY_ID": "AKIDENIED000000000"})
    finally:
        proc.terminate()
        proc.wait(10)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "s3://evals/qa.jsonl: access denied" in result.stderr
    assert "testing" not in result.stderr  # the secret key is never echoed


def test_bad_records_fail_validation_or_are_skipped_and_reported(tmp_path):
    data = tmp_path / "qa.jsonl"
    data.write_bytes(jsonl(QA[:2]) + b'{"question": "broken"\n' + jsonl([{"question": "q", "answer": "a"}]))
    job = {"dataset": {"uri": str(data)}, "metrics": [{"id": "exact_match"}]}
    proc = evalq("validate", str(write_job(tmp_path, job)))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{data} line 3: invalid JSON" in proc.stderr
    assert f"{data} line 4: target_output_location 'ground_truth' not found, required by exact_match" in proc.stderr
    job["dataset"]["on_bad_record"] = "skip"
    out = tmp_path / "out"
    proc = evalq("run", str(write_job(tmp_path, job)), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "skipped 2 bad record(s)" in proc.stderr
    assert [line["instance_id"] for line in read_log(out)] == ["1", "2"]
    run = json.loads((out / "run.json").read_text())
    assert run["dataset"]["bad_records_skipped"] == 2
    assert [b["where"] for b in run["dataset"]["bad_records"]] == [f"{data} line 3", f"{data} line 4"]


def test_azure_conversation_records_feed_the_conversation_metrics(tmp_path):
    records = [{"messages": [{"role": "user", "content": "Is the stove for indoor use?"},
                             {"role": "assistant", "content": "No, outdoor use only.",
                              "context": {"citations": [{"content": "Outdoor use only."}]}}]}]
    data = tmp_path / "chat.jsonl"
    data.write_bytes(jsonl(records))
    key_env = "TEST_CHAT_API_KEY"
    with JudgeSim([Region("lab")], api_key="k") as sim:
        job = write_job(tmp_path, {
            "dataset": {"uri": str(data)},
            "judges": {"sim": {"provider": "openai", "model": "m", "api_key_env": key_env,
                               "deployments": [{"region": "lab", "base_url": sim.base_url("lab"),
                                                "tpm": 100000, "rpm": 1000}]}},
            "judging": {"cache": False},
            "metrics": [{"id": "groundedness", "parameters": {"judge": "sim"}},
                        {"id": "relevance", "parameters": {"judge": "sim"}}]})
        proc = evalq("run", str(job), "--out", str(tmp_path / "out"), "-q", env={key_env: "k"})
    assert proc.returncode == 0, proc.stderr
    log = read_log(tmp_path / "out")
    assert {line["metric"] for line in log} == {"groundedness", "relevance"}
    assert all(1 <= line["result"]["score"] <= 5 for line in log)


def test_model_under_test_generates_then_metrics_run_and_rerun_uses_cache(tmp_path):
    records = [{"question": f"Say the word {w}", "ground_truth": f"Score: {s}"}
               for w, s in (("alpha [[sim:score=2]]", 2), ("beta [[sim:score=4]]", 4))]
    records.append({"question": "Already answered", "answer": "Score: 3", "ground_truth": "Score: 3"})
    data = tmp_path / "gen.jsonl"
    data.write_bytes(jsonl(records))
    key_env = "TEST_GEN_API_KEY"
    cache = tmp_path / "cache"
    with JudgeSim([Region("lab"), Region("eu")], api_key="k") as sim:
        job = write_job(tmp_path, {
            "dataset": {"uri": str(data)},
            "model": {"provider": "openai", "model": "m", "api_key_env": key_env, "max_tokens": 60,
                      "prompt_template": "Answer in one line: $model_input",
                      "deployments": [{"region": r, "base_url": sim.base_url(r), "tpm": 100000, "rpm": 1000}
                                      for r in ("lab", "eu")]},
            "metrics": [{"id": "exact_match"}]})
        env = {key_env: "k", "EVALQ_CACHE_DIR": str(cache)}
        for out in ("first", "second"):
            proc = evalq("run", str(job), "--out", str(tmp_path / out), "-q", env=env)
            assert proc.returncode == 0, proc.stderr
        calls = sim.stats()["lab"]["ok"] + sim.stats()["eu"]["ok"]
    assert calls == 2  # the second run was answered from the cache
    for out in ("first", "second"):
        log = read_log(tmp_path / out)
        generated = [line for line in log if line["metric"] == "generate"]
        assert [line["instance_id"] for line in generated] == ["1", "2"]
        assert "parameters" not in generated[0]  # not a metric: run.json has the model's, once
        run = json.loads((tmp_path / out / "run.json").read_text())
        assert run["generation"]["parameters"]["prompt_template"] == "Answer in one line: $model_input"
        scores = {line["instance_id"]: line["result"] for line in log if line["metric"] == "exact_match"}
        # judge-sim answers "Reason: ...\nScore: N": not equal to the reference, except the given answer
        assert scores == {"1": 0, "2": 0, "3": 1}
        assert generated[1]["result"]["output"].endswith("Score: 4")
    run = json.loads((tmp_path / "second" / "run.json").read_text())
    assert run["generation"]["n"] == 2 and run["generation"]["judge"]["cache_hits"] == 2


def test_python_model_runner(tmp_path):
    records = [{"id": "a", "input": "echo apple", "expected-output": ["APPLE!"]},
               {"id": "b", "input": "echo NOTHING", "expected-output": ["x"]},
               {"id": "c", "input": "echo pear", "expected-output": ["PEAR!"]}]
    data = tmp_path / "d.jsonl"
    data.write_bytes(jsonl(records))
    job = write_job(tmp_path, {"dataset": {"uri": str(data)},
                               "model": {"runner": "tests.plugins.echo_runner:LastWordRunner",
                                         "parameters": {"suffix": "!"}, "prompt_template": "$model_input"},
                               "metrics": [{"id": "exact_match"}]})
    proc = evalq("run", str(job), "--out", str(tmp_path / "out"), "-q")
    assert proc.returncode == 0, proc.stderr
    log = read_log(tmp_path / "out")
    generated = {line["instance_id"]: line for line in log if line["metric"] == "generate"}
    assert generated["a"]["result"] == {"output": "APPLE!", "log_probability": -float(len("echo apple"))}
    assert "no output" in generated["b"]["error"]
    em = {line["instance_id"]: line for line in log if line["metric"] == "exact_match"}
    assert em["a"]["result"] == 1 and em["c"]["result"] == 1
    assert "the model under test gave no output" in em["b"]["error"]
    results = read_results(tmp_path / "out")["exact_match"]
    assert (results["n"], results["n_errors"]) == (2, 1)


def test_a_runner_that_cannot_be_built_fails_its_items_not_the_job(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_bytes(jsonl([{"id": "a", "input": "echo apple", "expected-output": ["APPLE"]}]))
    job = write_job(tmp_path, {"dataset": {"uri": str(data)},
                               "model": {"runner": "tests.plugins.echo_runner:LastWordRunner",
                                         "parameters": {"suffix": "FAIL"}},
                               "metrics": [{"id": "exact_match"}]})
    proc = evalq("run", str(job), "--out", str(tmp_path / "out"), "-q")
    assert proc.returncode == 0, proc.stderr
    generated, scored = read_log(tmp_path / "out")
    assert "building tests.plugins.echo_runner:LastWordRunner failed: ValueError: this runner refuses" in \
        generated["error"]
    assert "the model under test gave no output" in scored["error"]


def test_planning_many_lines_keeps_memory_flat(tmp_path):
    import psutil

    def peak_rss(lines: int) -> float:
        data = tmp_path / f"big{lines}.jsonl.gz"
        with gzip.open(data, "wb", compresslevel=1) as f:
            buf = io.BytesIO()
            for i in range(lines):
                buf.write(b'{"question": "q%d", "answer": "a b c", "ground_truth": "a b <OR> c"}\n' % i)
                if buf.tell() > 1 << 20:
                    f.write(buf.getvalue())
                    buf = io.BytesIO()
            f.write(buf.getvalue())
        job = write_job(tmp_path, {"dataset": {"uri": str(data)}, "metrics": [{"id": "exact_match"}]})
        proc = subprocess.Popen([sys.executable, "-m", "evalq.cli", "validate", str(job)], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ps, peak = psutil.Process(proc.pid), 0
        while proc.poll() is None:
            try:
                peak = max(peak, ps.memory_info().rss)
            except psutil.NoSuchProcess:
                break
            time.sleep(0.02)
        out, err = proc.communicate()
        assert proc.returncode == 0, err
        assert f"valid: {lines} instances" in out
        return peak / 2**20

    # a quarter of a million lines tells streaming from holding: 16 bytes an instance of bookkeeping
    # is 4 MiB more than for 10k lines, where holding the instances (a dict of three strings each,
    # ~500 bytes) would be over 100 MiB more (bench/bench_submit.py plans millions)
    small, big = peak_rss(10_000), peak_rss(250_000)
    print(f"peak RSS: {small:.0f} MiB for 10k lines, {big:.0f} MiB for 250k lines")
    assert big - small < 24, (small, big)
    assert big < 150, big
