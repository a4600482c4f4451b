"""Issue 37, the suspected spend items, settled on a real cluster (a judge worker, judge-sim as the
priced deployment, counting prompt tokens its own way):

- a tenant's daily cost limit under several concurrent jobs of the tenant, whose calls' prompt
  estimates are low: each call used to hold its estimated prompt at admission and its real cost was
  counted in its place when the reply came, so calls admitted side by side within the limit could
  settle past it. A call now holds its worst case (its prompt's bytes bound its tokens), so what the
  server counted, priced, never passes the limit;
- a catalogue deployment without a price never takes the job's own judge-level price.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from evalq.sim import JudgeSim, Region
from tests.conftest import ROOT, read_log, start_worker, stop_worker, wait_for_worker

pytestmark = pytest.mark.integration

KEY_ENV = "TEST_SPEND_API_KEY"
PRICE = {"input_per_1k": 1.0, "output_per_1k": 1.0}
DAILY = 10.0


def money(prompt: int, completion: int) -> float:
    return (prompt * PRICE["input_per_1k"] + completion * PRICE["output_per_1k"]) / 1000


def job(sim, tag: str, n: int) -> dict:
    # 'a' * 2000 counts ~250 tokens with cl100k (evalq's estimate) and 500 with judge-sim: every
    # call's estimate is low by half
    return {"instances": [{"id": f"{tag}{i}", "input": f"Question {i} {tag}?", "actual-output": "a" * 2000}
                          for i in range(n)],
            "judges": {"sim": {"provider": "openai", "model": "judge-sim", "api_key_env": KEY_ENV, "max_tokens": 60,
                               "max_retries": 1, "timeout": 10, "output": "text", "price": PRICE,
                               "deployments": [{"region": "lab", "base_url": sim.base_url("lab"), "tpm": 10_000_000,
                                                "rpm": 100_000}]}},
            "judging": {"cache": False}, "scheduling": {"tenant": "ads"},
            "metrics": [{"id": "fluency", "parameters": {"judge": "sim"}}]}


def test_concurrent_jobs_of_a_tenant_never_spend_past_its_daily_limit(private_redis, tmp_path):
    env = {KEY_ENV: "k", "EVALQ_TENANTS": f"ads=1;ads.daily_cost={DAILY:g}"}
    with JudgeSim([Region("lab")], latency=0.05, api_key="k", seed=3) as sim:
        logs = tmp_path / "logs"
        logs.mkdir()
        workers = [start_worker(private_redis, "judge.lab", logs, concurrency=8, env=env, name="judge"),
                   start_worker(private_redis, "cpu", logs, concurrency=1, env=env, name="cpu")]
        try:
            for w in ("judge", "cpu"):
                wait_for_worker(private_redis, w)
            runs = []
            for k in range(2):
                path = tmp_path / f"ads{k}.json"
                path.write_text(json.dumps(job(sim, f"j{k}-", 12)))
                runs.append(subprocess.Popen(
                    [sys.executable, "-m", "evalq.cli", "run", str(path), "--out", str(tmp_path / f"ads{k}"),
                     "--broker", private_redis, "--chunk-size", "1"],
                    cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            for proc in runs:
                _, err = proc.communicate(timeout=180)
                assert proc.returncode in (0, 1), err
            stats = sim.stats("lab")
        finally:
            for w in workers:
                stop_worker(w)
    paid = money(stats["prompt_tokens"], stats["completion_tokens"])  # what the server counted, priced
    assert 0 < paid <= DAILY, (paid, stats)
    errors = [line["error"] for k in range(2) for line in read_log(tmp_path / f"ads{k}") if "error" in line]
    assert errors and all(f"tenant 'ads''s daily cost limit of {DAILY:g} reached" in e for e in errors), errors
    assert stats["ok"] + len(errors) == 24 and stats["ok"] >= 5  # the limit, not a stall, stopped them


def test_a_catalogue_deployment_without_a_price_never_takes_the_jobs(tmp_path, monkeypatch):
    """Before: a catalogue entry without a price fell back to the job's judge-level price, so a
    job wrote what its calls counted against its tenant's cost limits."""
    from evalq.shared.job.schema import parse_job

    catalogue = tmp_path / "catalogue.json"
    catalogue.write_text(json.dumps({"deployments": {
        "free": {"region": "lab", "base_url": "http://127.0.0.1:9/v1", "tpm": 1000, "rpm": 10},
        "priced": {"region": "eu", "base_url": "http://127.0.0.1:9/v1", "tpm": 1000, "rpm": 10, "price": PRICE}}}))
    monkeypatch.setenv("EVALQ_CATALOGUE", str(catalogue))
    monkeypatch.setenv(KEY_ENV, "k")
    tiny = {"input_per_1k": 1e-9, "output_per_1k": 1e-9}
    parsed = parse_job({"instances": [{"id": "a", "input": "q", "actual-output": "a"}],
                        "judges": {"j": {"provider": "openai", "model": "m", "api_key_env": KEY_ENV, "price": tiny,
                                         "deployments": [{"use": "free"}, {"use": "priced"}]}},
                        "metrics": [{"id": "fluency", "parameters": {"judge": "j"}}]})
    judge = parsed.metrics[0].judge
    free, priced = judge.deployments
    assert judge.price_of(free) is None  # the operator's word: no price, never the job's
    assert judge.price_of(priced).input_per_1k == PRICE["input_per_1k"]
    # a tenant with a cost limit may not use a deployment the operator does not price: its calls
    # could not be counted against the limit
    from evalq.orchestrator.tenancy import tenant_policy
    from evalq.shared.core.errors import JobError
    from evalq.shared.cluster.scheduling import Tenants

    tenants = Tenants.parse("ads=1;ads.daily_cost=5")
    import copy

    with pytest.raises(JobError, match="gives no price for 'free'"):
        tenant_policy(copy.deepcopy(parsed), "ads", tenants)
    tenant_policy(copy.deepcopy(parsed), "search", tenants)  # no cost limit of its own: nothing to count
