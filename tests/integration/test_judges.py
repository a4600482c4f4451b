"""LLM-as-judge metrics against judge-sim over real HTTP, with real worker processes."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
import redis

from evalq.sim import Faults, JudgeSim, Region
from evalq.cli.run import run_job
from evalq.shared.job.schema import parse_job
from tests.conftest import evalq, read_log, read_results, start_worker, stop_worker, wait_for_worker

pytestmark = pytest.mark.integration

SECRET = "sk-evalq-test-" + uuid.uuid4().hex
KEY_ENV = "TEST_JUDGE_API_KEY"


@pytest.fixture(scope="module")
def sim():
    with JudgeSim([Region("lab"), Region("eu")], latency=0.01, api_key=SECRET, seed=3) as s:
        yield s


@pytest.fixture(scope="module")
def judge_worker(redis_url, tmp_path_factory):
    os.environ[KEY_ENV] = SECRET
    name = f"judge{uuid.uuid4().hex[:6]}"
    logs = tmp_path_factory.mktemp("judge-workers")
    proc = start_worker(redis_url, "judge.lab,judge.eu", logs, concurrency=8, name=name)
    wait_for_worker(redis_url, name)
    yield proc
    stop_worker(proc)
    assert SECRET not in proc.log_path.read_text(errors="replace")


def judges(sim, output="json_schema", max_retries=1, regions=("lab",), **extra) -> dict:
    return {"sim": {"provider": "openai", "model": "judge-sim", "api_key_env": KEY_ENV, "output": output,
                    "max_tokens": 100, "max_retries": max_retries, "timeout": 5,
                    "deployments": [{"region": r, "base_url": sim.base_url(r), "tpm": 10_000_000,
                                     "rpm": 100_000} for r in regions], **extra}}


def qa(i: int, answer: str) -> dict:
    return {"id": f"q{i}", "input": f"Question {i}?", "actual-output": answer,
            "expected-output": [f"Reference {i}."], "context": f"Context {i}."}


def run(job_dict, out: Path, redis_url) -> list[dict]:
    return run_job(parse_job(job_dict), out, broker=redis_url, progress=False, stall_timeout=120)


@pytest.mark.parametrize("output", ["auto", "json_schema", "json_object", "tools", "text"])
def test_scores_parse_in_every_reply_form(sim, judge_worker, redis_url, tmp_path, output):
    instances = [qa(i, f"Answer {i} {uuid.uuid4().hex} [[sim:score={1 + i % 5}]]") for i in range(10)]
    job = {"instances": instances, "judges": judges(sim, output), "judging": {"cache": False},
           "metrics": [{"id": "coherence", "parameters": {"judge": "sim", "threshold": 4}},
                       {"id": "groundedness", "parameters": {"judge": "sim"}}]}
    run(job, tmp_path, redis_url)
    log = read_log(tmp_path)
    for line in log:
        assert "error" not in line, line
        i = int(line["instance_id"][1:])
        assert line["result"]["score"] == 1 + i % 5
        assert line["result"]["reason"]
    results = read_results(tmp_path)
    coherence = results["coherence"]
    assert coherence["score"]["mean"] == pytest.approx(3.0)
    assert coherence["score"]["distribution"] == {"1": 2, "2": 2, "3": 2, "4": 2, "5": 2}
    assert coherence["score"]["pass_rate"] == pytest.approx(0.4)
    assert coherence["judge"]["calls"] == 10 and coherence["judge"]["cache_hits"] == 0


def test_failures_are_recorded_per_item_and_retries_recover(sim, judge_worker, redis_url, tmp_path):
    tag = uuid.uuid4().hex
    answers = {0: "fine", 1: "[[sim:500]]", 2: "[[sim:500-once]]", 3: "[[sim:malformed]]",
               5: "[[sim:score=2]]"}
    instances = [qa(i, f"{tag} {a}") for i, a in answers.items()]
    job = {"instances": instances, "judges": judges(sim, "text"), "judging": {"cache": False},
           "metrics": [{"id": "fluency", "parameters": {"judge": "sim"}}]}
    run(job, tmp_path, redis_url)
    by_id = {line["instance_id"]: line for line in read_log(tmp_path)}
    assert "HTTP 500" in by_id["q1"]["error"]
    assert "no valid score" in by_id["q3"]["error"]
    for ok in ("q0", "q2", "q5"):
        assert "result" in by_id[ok], by_id[ok]
        assert 1 <= by_id[ok]["result"]["score"] <= 5
    assert by_id["q5"]["result"]["score"] == 2
    results = read_results(tmp_path)["fluency"]
    assert (results["n"], results["n_errors"]) == (3, 2)


def test_retry_after_pauses_the_deployment_and_is_honoured(sim, judge_worker, redis_url, tmp_path):
    sim.reset_stats("lab")
    job = {"instances": [qa(0, f"{uuid.uuid4().hex} [[sim:429-once]] [[sim:score=5]]")],
           "judges": judges(sim), "judging": {"cache": False},
           "metrics": [{"id": "fluency", "parameters": {"judge": "sim"}}]}
    run(job, tmp_path, redis_url)
    line = read_log(tmp_path)[0]
    assert line["result"]["score"] == 5
    assert read_results(tmp_path)["fluency"]["judge"]["rate_limited"] == 1
    stats = sim.stats("lab")
    assert stats["rate_limited"] == 1 and stats["ok"] == 1


def test_unchanged_rerun_is_answered_from_cache(sim, judge_worker, redis_url, tmp_path):
    tag = uuid.uuid4().hex
    job = {"instances": [qa(i, f"{tag} answer {i}") for i in range(8)], "judges": judges(sim),
           "metrics": [{"id": "relevance", "parameters": {"judge": "sim"}},
                       {"id": "similarity", "parameters": {"judge": "sim"}}]}
    run(job, tmp_path / "first", redis_url)
    before = sim.stats("lab")["requests"]
    run(job, tmp_path / "second", redis_url)
    assert sim.stats("lab")["requests"] == before
    first, second = read_results(tmp_path / "first"), read_results(tmp_path / "second")
    assert second["relevance"]["judge"]["calls"] == 0
    assert second["relevance"]["judge"]["cache_hits"] == 8
    assert first["relevance"]["judge"]["calls"] == 8
    assert first["relevance"]["score"] == second["relevance"]["score"]


def test_a_model_of_the_same_name_elsewhere_is_not_answered_from_the_cache(sim, judge_worker, redis_url, tmp_path):
    """Two judges of one model name on two endpoints (a self-hosted base_url, and another): the
    cache and the job's memo know who answers a call, so neither answers the other's requests."""
    tag = uuid.uuid4().hex
    instances = [qa(i, f"{tag} answer {i}") for i in range(6)]
    here, there = judges(sim, regions=("lab",))["sim"], judges(sim, regions=("eu",))["sim"]
    first = {"instances": instances, "judges": {"sim": here},
             "metrics": [{"id": "relevance", "parameters": {"judge": "sim"}}]}
    run(first, tmp_path / "here", redis_url)
    eu_before = sim.stats("eu")["requests"]
    both = {"instances": instances, "judges": {"sim": here, "other": there},
            "metrics": [{"id": "relevance", "parameters": {"judge": "sim"}},
                        {"id": "relevance", "parameters": {"judge": "other"}}]}
    run(both, tmp_path / "both", redis_url)
    results = json.loads((tmp_path / "both" / "results.json").read_text())
    assert results[0]["judge"]["cache_hits"] == 6 and results[0]["judge"]["calls"] == 0  # the same endpoint
    assert results[1]["judge"]["cache_hits"] == 0 and results[1]["judge"]["calls"] == 6  # its own endpoint
    assert results[1]["judge"]["reused"] == 0
    assert sim.stats("eu")["requests"] - eu_before == 6


def test_token_cap_skips_items_without_losing_them(sim, judge_worker, redis_url, tmp_path):
    tag = uuid.uuid4().hex
    job = {"instances": [qa(i, f"{tag} answer {i}") for i in range(12)], "judges": judges(sim),
           "judging": {"cache": False, "token_cap": 1500},
           "metrics": [{"id": "coherence", "parameters": {"judge": "sim"}}]}
    run(job, tmp_path, redis_url)
    log = read_log(tmp_path)
    assert len(log) == 12
    skipped = [line for line in log if "skipped" in line]
    scored = [line for line in log if "result" in line]
    assert skipped and scored and len(skipped) + len(scored) == 12
    assert all("token cap" in line["skipped"] for line in skipped)
    results = read_results(tmp_path)["coherence"]
    assert results["n_skipped"] == len(skipped) and results["n"] == len(scored)


def test_rubric_with_few_shot_examples(sim, judge_worker, redis_url, tmp_path):
    job = {"instances": [qa(i, f"{uuid.uuid4().hex} [[sim:score={i}]]") for i in range(4)],
           "judges": judges(sim, "tools"), "judging": {"cache": False},
           "metrics": [{"id": "rubric", "parameters": {
               "judge": "sim", "criteria": "Is the answer correct and complete?", "scale_min": 0,
               "scale_max": 3, "threshold": 2,
               "examples": [{"score": 0, "output": "I don't know."}, {"score": 3, "output": "Paris."}]}}]}
    run(job, tmp_path, redis_url)
    scores = sorted(line["result"]["score"] for line in read_log(tmp_path))
    assert scores == [0, 1, 2, 3]
    result = read_results(tmp_path)["rubric"]
    assert result["score"]["pass_rate"] == pytest.approx(0.5)
    assert result["score"]["distribution"] == {"0": 1, "1": 1, "2": 1, "3": 1}


def test_work_spreads_over_deployments(sim, judge_worker, redis_url, tmp_path):
    sim.reset_stats()
    job = {"instances": [qa(i, f"{uuid.uuid4().hex}") for i in range(20)],
           "judges": judges(sim, regions=("lab", "eu")), "judging": {"cache": False},
           "metrics": [{"id": "fluency", "parameters": {"judge": "sim"}}]}
    run(job, tmp_path, redis_url)
    stats = sim.stats()
    assert stats["lab"]["ok"] > 0 and stats["eu"]["ok"] > 0
    assert stats["lab"]["ok"] + stats["eu"]["ok"] == 20


def test_no_secret_anywhere(sim, judge_worker, redis_url, tmp_path):
    job = {"instances": [qa(i, f"{uuid.uuid4().hex}") for i in range(3)], "judges": judges(sim),
           "metrics": [{"id": "coherence", "parameters": {"judge": "sim"}}]}
    run(job, tmp_path, redis_url)
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), path
    r = redis.Redis.from_url(redis_url)
    for key in r.scan_iter(count=1000):
        kind = r.type(key)
        if kind == b"string":
            values = [r.get(key)]
        elif kind == b"hash":
            values = list(r.hgetall(key).values())
        elif kind == b"list":
            values = r.lrange(key, 0, -1)
        elif kind == b"zset":
            values = [m for m, _ in r.zrange(key, 0, -1, withscores=True)]
        elif kind == b"set":
            values = list(r.smembers(key))
        else:
            values = []
        assert not any(SECRET.encode() in (v or b"") for v in values), key


def test_missing_key_variable_is_a_validation_error(sim, tmp_path):
    job = {"instances": [qa(0, "a")], "metrics": [{"id": "coherence", "parameters": {"judge": "sim"}}],
           "judges": {"sim": {**judges(sim)["sim"], "api_key_env": "EVALQ_SURELY_UNSET_VAR"}}}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    proc = evalq("validate", str(path))
    assert proc.returncode == 2
    assert "judges.sim.api_key_env: environment variable EVALQ_SURELY_UNSET_VAR is not set" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_judge_name_and_config_are_checked(sim, tmp_path):
    job = {"instances": [qa(0, "a")], "metrics": [{"id": "coherence", "parameters": {"judge": "simm"}}],
           "judges": {"sim": {**judges(sim)["sim"]},
                      "az": {"provider": "azure", "model": "gpt-4o", "api_key_env": KEY_ENV,
                             "deployments": [{"region": "east us", "tpm": 0, "rpm": 10}]}}}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    proc = evalq("validate", str(path), env={KEY_ENV: "x"})
    assert proc.returncode == 2
    assert "no judge named 'simm'; did you mean 'sim'?" in proc.stderr
    assert "judges.az.deployments.0.region" in proc.stderr
    assert "judges.az.deployments.0.tpm" in proc.stderr


def test_a_failing_deployment_is_drained_to_the_others(sim, judge_worker, redis_url, tmp_path):
    from evalq.cli.embedded import free_port
    from evalq.workers.judge.budget import FAIL_THRESHOLD

    cfg = judges(sim, regions=("lab",))["sim"]
    dead = {"region": "eu", "base_url": f"http://127.0.0.1:{free_port()}/v1", "tpm": 10_000_000,
            "rpm": 100_000}
    cfg = {**cfg, "deployments": [dead, *cfg["deployments"]]}  # the dead one is preferred for half the work
    n = 60
    job = {"instances": [qa(i, f"{uuid.uuid4().hex}") for i in range(n)], "judges": {"sim": cfg},
           "judging": {"cache": False}, "metrics": [{"id": "fluency", "parameters": {"judge": "sim"}}]}
    run(job, tmp_path, redis_url)
    assert all("result" in line for line in read_log(tmp_path))
    acct = read_results(tmp_path)["fluency"]["judge"]
    # half the items prefer the dead deployment; once it is drained they stop trying it
    assert acct["failed_calls"] <= FAIL_THRESHOLD + 8 < n // 2
    assert acct["calls"] == n


def test_embedded_rerun_is_answered_from_the_saved_cache(sim, tmp_path):
    job = {"instances": [qa(i, f"{uuid.uuid4().hex}") for i in range(3)],
           "judges": judges(sim, regions=("eu",)),
           "metrics": [{"id": "coherence", "parameters": {"judge": "sim"}}]}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    cache = tmp_path / "cache"
    env = {KEY_ENV: SECRET, "EVALQ_CACHE_DIR": str(cache)}
    for out in ("first", "second"):
        proc = evalq("run", str(path), "--out", str(tmp_path / out), "-q", env=env)
        assert proc.returncode == 0, proc.stderr
    assert read_results(tmp_path / "first")["coherence"]["judge"]["calls"] == 3
    assert read_results(tmp_path / "second")["coherence"]["judge"]["calls"] == 0
    assert read_results(tmp_path / "second")["coherence"]["judge"]["cache_hits"] == 3
    assert (cache / "embedded-redis.rdb").exists()
    assert SECRET.encode() not in (cache / "embedded-redis.rdb").read_bytes()


def test_a_judge_that_changed_is_a_break_in_the_suites_history_not_a_regression(sim, tmp_path):
    """Issue 61: the provider updates the model behind the judge's alias (judge-sim answers as another
    version) and tonight's scores drop: results.json names both nights' judges, the history marks the
    break with a "judge changed" line and finds no regression; a cached rerun keeps the judge."""
    from evalq.results.history import open_store

    suite = f"judged-{uuid.uuid4().hex[:6]}"
    cache = tmp_path / "cache"
    env = {KEY_ENV: SECRET, "EVALQ_CACHE_DIR": str(cache)}

    def night(name: str, score) -> dict:
        job = {"suite": suite, "instances": [qa(i, f"Answer {i} [[sim:score={score(i)}]]") for i in range(12)],
               "judges": judges(sim, regions=("eu",)),
               "metrics": [{"id": "coherence", "parameters": {"judge": "sim"}}]}
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(job))
        proc = evalq("run", str(path), "--out", str(tmp_path / name), "-q", env=env)
        assert proc.returncode == 0, proc.stderr
        return read_results(tmp_path / name)["coherence"]["judge"]["identity"]

    sim.versions["judge-sim"] = "judge-sim-2026-05-13"
    try:
        first = night("first", lambda i: 5)
        second = night("second", lambda i: 5)  # the same items: answered from the cache, the same judge
        sim.versions["judge-sim"] = "judge-sim-2026-11-20"
        third = night("third", lambda i: 1 + i % 2)  # new answers, scored low by the updated judge
    finally:
        sim.versions.clear()
    assert first["versions"] == second["versions"] == ["judge-sim-2026-05-13"] and first["id"] == second["id"]
    assert third["versions"] == ["judge-sim-2026-11-20"] and third["id"] != first["id"]
    assert first["model"] == "judge-sim" and len(first["prompt"]) == 64 and first["prompt"] == third["prompt"]
    runs = open_store(f"sqlite:///{cache / 'history.sqlite'}").runs_of(suite)
    assert [len(r["regressions"]) for r in runs] == [0, 0, 0]
    assert [bool(r["metrics"][0].get("judge_changed")) for r in runs] == [False, False, True]
    shown = evalq("history", suite, env=env)
    assert shown.returncode == 0 and "JUDGE CHANGED" in shown.stdout and "judge-sim-2026-11-20" in shown.stdout
    assert "REGRESSION" not in shown.stdout
