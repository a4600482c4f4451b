"""The operator owns a shared deployment's capacity and price (issue 31), on a real cluster: a
private Redis, real judge and jobs workers given the operator's catalogue, judge-sim.

Before: the budget keys were shared by every job on a deployment while its tpm, rpm, window and
pacing came from each job, so a 2-item job declaring a huge window moved the shared pace key
weeks ahead, and another tenant's job then did 0/40. Now a job names the catalogue's deployment;
one that declares its own gets keys of its own (``inline: own``), and holds only itself."""

from __future__ import annotations

import contextlib
import json
import time

import pytest
import redis

from evalq.sim import JudgeSim, Region
from tests.conftest import evalq, read_log, read_results, start_worker, stop_worker, wait_for_worker

pytestmark = pytest.mark.integration

KEY_ENV = "TEST_JUDGE_API_KEY"
PRICE = {"input_per_1k": 0.001, "output_per_1k": 0.002}


def judge(deployments: list[dict]) -> dict:
    return {"sim": {"provider": "openai", "model": "judge-sim", "api_key_env": KEY_ENV, "max_tokens": 60,
                    "timeout": 5, "max_retries": 1, "deployments": deployments}}


def job_file(path, tag: str, n: int, deployments: list[dict]):
    path.write_text(json.dumps({
        "instances": [{"id": f"{tag}{i}", "input": f"Question {i} {tag}?", "actual-output": f"Answer {i}.",
                       "context": f"Context {i}."} for i in range(n)],
        "judges": judge(deployments), "judging": {"cache": False},
        "metrics": [{"id": "coherence", "parameters": {"judge": "sim"}}]}))
    return path


@contextlib.contextmanager
def catalogue_cluster(url: str, tmp_path, monkeypatch, inline: str, seed: int):
    """judge-sim's region 'lab' as the operator's catalogue deployment 'lab' (priced), and a jobs
    worker and a judge worker given that catalogue and ``inline`` policy; this process too."""
    with JudgeSim([Region("lab")], latency=0.01, seed=seed) as sim:
        catalogue = tmp_path / "catalogue.json"
        catalogue.write_text(json.dumps({"inline": inline, "deployments": {"lab": {
            "region": "lab", "base_url": sim.base_url("lab"), "tpm": 200_000, "rpm": 2_000, "price": PRICE}}}))
        env = {"EVALQ_CATALOGUE": str(catalogue), KEY_ENV: "k", "EVALQ_ENDPOINTS": "*=http://127.0.0.1:*",
               "EVALQ_INLINE_DEPLOYMENTS": inline}
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        logs = tmp_path / "logs"
        logs.mkdir()
        workers = [start_worker(url, "evalq.jobs,cpu", logs, concurrency=1, env=env, name="jobs"),
                   start_worker(url, "judge.lab", logs, concurrency=4, env=env, name="judge")]
        try:
            for w in ("jobs", "judge"):
                wait_for_worker(url, w)
            yield sim, env, redis.Redis.from_url(url)
        finally:
            for w in workers:
                stop_worker(w)


def forged(r: redis.Redis, url: str, path, out, n: int, **deployment) -> str:
    """A job naming catalogue deployment 'lab', stored with its deployment's fields changed as a
    message writing Redis could (validation never saw them), and started; its id."""
    from evalq.orchestrator import submit as submitting
    from evalq.shared.job.schema import parse_job

    job = parse_job(json.loads(job_file(path, path.stem, n, [{"use": "lab"}]).read_text()))
    spec = submitting.job_spec(job, None, str(out))
    spec["judges"]["sim"]["deployments"][0].update(deployment)
    job_id = submitting.store_job(r, job, spec)
    submitting.start(r, url, job_id, spec)
    return job_id


def wait_done(r: redis.Redis, job_id: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while r.get(f"evalq:{{{job_id}}}:status") != b"done":
        assert time.monotonic() < deadline, f"job {job_id} did not end"
        time.sleep(0.1)


def test_a_job_cannot_move_a_catalogue_deployments_pace_for_others(private_redis, tmp_path, monkeypatch):
    """The attack, as a message could make it: a stored spec naming the operator's 'lab' with one
    request a minute over an hour's window and an hour's burst (what validation would refuse; the
    workers do not trust the spec either). Its workers run it on the catalogue's numbers, its lower
    rate on keys of its own; another job on 'lab' runs at the catalogue's rate meanwhile. A job that
    declares the endpoint itself (``inline: own``) has keys of its own too."""
    with catalogue_cluster(private_redis, tmp_path, monkeypatch, "own", seed=5) as (sim, env, r):
        attackers = [forged(r, private_redis, tmp_path / "a.json", tmp_path / "a-out", 3, tpm=1_000, rpm=1,
                            window_seconds=3600, burst_seconds=3600)]
        inline = job_file(tmp_path / "b.json", "b", 3, [
            {"region": "lab", "base_url": sim.base_url("lab"), "tpm": 1_000, "rpm": 1,
             "window_seconds": 3600, "burst_seconds": 3600}])
        sent = evalq("submit", str(inline), "--out", str(tmp_path / "b-out"), "--broker", private_redis, env=env)
        assert sent.returncode == 0, sent.stderr
        attackers.append(sent.stdout.strip())
        deadline = time.monotonic() + 30
        while sim.stats("lab")["requests"] < 2:  # their first calls went: their pace is an hour ahead
            assert time.monotonic() < deadline, "the attackers' jobs never called"
            time.sleep(0.1)
        # the victim names the operator's deployment (no price of its own) and runs at its rate
        victim = job_file(tmp_path / "victim.json", "v", 40, [{"use": "lab"}])
        # at the attackers' pace (a call a minute) its 40 calls would take 40 minutes: it would stall
        # (no item for 60 s) or outlast the command's timeout, however fast the machine
        proc = evalq("run", str(victim), "--out", str(tmp_path / "v-out"), "--broker", private_redis, "-q",
                     "--stall-timeout", "60", env=env, timeout=240)
        assert proc.returncode == 0, proc.stderr
        log = read_log(tmp_path / "v-out")
        assert len(log) == 40 and all("result" in line for line in log), [x for x in log if "error" in x][:2]
        coherence = read_results(tmp_path / "v-out")["coherence"]
        assert coherence["judge"]["calls"] == 40
        assert coherence["judge"]["cost"] > 0  # the catalogue's price is counted, though the job gave none
        # the attackers' own limits hold them: one call each in all that time
        for job_id in attackers:
            assert r.hlen(f"evalq:{{{job_id}}}:res:coherence@0") <= 1
            assert evalq("cancel", job_id, "--broker", private_redis, env=env).returncode == 0


def test_a_forged_spec_runs_on_the_catalogues_numbers_and_a_refused_one_errors_per_item(private_redis, tmp_path,
                                                                                        monkeypatch):
    """What a worker runs comes from its own catalogue, not from the stored spec: a spec naming
    'lab' with a forged TPM and price is judged at the catalogue's price; one naming a deployment
    the worker's catalogue lacks gets an error on each item, and nothing is sent."""
    with catalogue_cluster(private_redis, tmp_path, monkeypatch, "deny", seed=6) as (sim, env, r):
        job_id = forged(r, private_redis, tmp_path / "f.json", tmp_path / "forged", 6, tpm=10**8,
                        price={"input_per_1k": 0.0, "output_per_1k": 0.0})
        wait_done(r, job_id)
        assert read_results(tmp_path / "forged")["coherence"]["judge"]["cost"] > 0
        # a stored spec naming a deployment this worker's catalogue lacks: refused per item
        before = sim.stats("lab")["requests"]
        wait_done(r, forged(r, private_redis, tmp_path / "g.json", tmp_path / "gone", 4, use="elsewhere"))
        log = read_log(tmp_path / "gone")
        assert len(log) == 4 and all("not in this worker's catalogue" in line["error"] for line in log), log
        assert sim.stats("lab")["requests"] == before


def test_an_operator_without_a_catalogue_is_told(private_redis, tmp_path):
    """Issue 38: ten jobs declaring one shared deployment inline got budget keys of their own on
    cluster workers (the safe default), so together they overran its TPM (203 of 2,008 calls
    answered 429) and nothing said why. A worker says so once at start, and `evalq plan` says
    which of a job's deployments would run on keys of their own."""
    logs = tmp_path / "logs"
    logs.mkdir()
    unset = {"EVALQ_INLINE_DEPLOYMENTS": "", "EVALQ_CATALOGUE": ""}
    worker = start_worker(private_redis, "evalq.jobs,cpu", logs, concurrency=1, name="bare", env=unset)
    try:
        wait_for_worker(private_redis, "bare")
    finally:
        stop_worker(worker)
    said = worker.log_path.read_text()
    assert said.count("no catalogue of deployments is loaded") == 1, said[-2000:]
    assert "jobs that declare the same endpoint do not share its TPM" in said
    catalogue = tmp_path / "catalogue.json"
    catalogue.write_text(json.dumps({"inline": "own", "deployments": {"lab": {
        "region": "lab", "base_url": "http://127.0.0.1:9/v1", "tpm": 1000, "rpm": 10}}}))
    worker = start_worker(private_redis, "cpu", logs, concurrency=1, name="cat",
                          env={**unset, "EVALQ_CATALOGUE": str(catalogue)})
    try:
        wait_for_worker(private_redis, "cat")
    finally:
        stop_worker(worker)
    assert "no catalogue of deployments" not in worker.log_path.read_text()
    # the plan names the inline deployment and what a cluster gives it
    path = job_file(tmp_path / "inline.json", "p", 4, [{"region": "lab", "base_url": "http://127.0.0.1:9/v1",
                                                        "tpm": 1000, "rpm": 10}])
    shown = evalq("plan", str(path), env={**unset, KEY_ENV: "k"})
    assert shown.returncode == 0, shown.stderr
    assert ("on a cluster: judges.sim.deployments[0] (lab, http://127.0.0.1:9/v1) runs on budget keys of this "
            "job's own") in shown.stdout
    named = job_file(tmp_path / "named.json", "q", 4, [{"use": "lab"}])
    shown = evalq("plan", str(named), env={**unset, "EVALQ_CATALOGUE": str(catalogue), KEY_ENV: "k"})
    assert shown.returncode == 0 and "on a cluster" not in shown.stdout, shown.stdout + shown.stderr
