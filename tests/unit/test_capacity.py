"""Capacity a deployment learns (evalq.shared.judging.capacity): how ``"tpm": "auto"`` and
``"capacity": "adaptive"`` are declared and checked, what the providers' rate-limit headers are read
as, and what a catalogue lets a job ask of a learning deployment. The learning on a real Redis and
against judge-sim and llama.cpp is tests/integration/test_capacity.py."""

from __future__ import annotations

import json

import pytest

from evalq.cli.capacity import learning
from evalq.shared.core import bounds
from evalq.shared.job.schema import parse_job
from evalq.shared.judging.capacity import DEFAULT_TPM_FLOOR, describe, duration, rate_headers
from evalq.shared.judging.deployments import CATALOGUE_ENV, INLINE_ENV, govern
from evalq.shared.judging.judges import Deployment, JudgeConfig
from tests.unit.test_deployments import job, problems

URL = "http://127.0.0.1:9/v1"


def deployment(**fields) -> Deployment:
    return Deployment.model_validate({"region": "lab", "base_url": URL, **fields})


def test_auto_starts_at_its_floor_and_is_held_by_its_ceiling():
    d = deployment(tpm="auto", rpm=600, tpm_floor=20_000, tpm_ceiling=450_000)
    assert (d.tpm_start, d.tpm_most, d.rpm_start, d.rpm_most) == (20_000, 450_000, 600, 600)
    assert d.learns and d.capacity == "fixed"
    plain = deployment(tpm="auto")
    assert plain.tpm_start == DEFAULT_TPM_FLOOR and plain.tpm_most == bounds.MAX_TPM
    assert plain.rpm_start == bounds.MAX_RPM  # no RPM stated: none held
    assert not deployment(tpm=1000, rpm=10).learns


def test_a_deployment_that_states_no_quota_is_adaptive():
    d = deployment()
    assert d.capacity == "adaptive" and d.learns
    assert (d.tpm_start, d.rpm_start) == (bounds.MAX_TPM, bounds.MAX_RPM)
    bounded = deployment(concurrency={"start": 2, "min": 1, "max": 8})
    assert bounded.concurrency.max == 8
    # stated limits keep it fixed unless it says otherwise; both together are allowed
    assert deployment(tpm=1000).capacity == "fixed"
    assert deployment(tpm="auto", capacity="adaptive").capacity == "adaptive"


@pytest.mark.parametrize("fields, says", [
    ({"tpm": 1000, "tpm_floor": 10}, "tpm_floor and tpm_ceiling are for"),
    ({"tpm": "auto", "tpm_floor": 500, "tpm_ceiling": 100}, "is above tpm_ceiling"),
    ({"capacity": "fixed"}, "states 'tpm' or 'rpm'"),
    ({"tpm": 100, "concurrency": {"max": 4}}, "bounds are for"),
    ({"concurrency": {"start": 9, "max": 4}}, "min <= start <= max"),
    ({"tpm": "lots"}, "tpm"),
])
def test_limits_that_do_not_fit_together_are_named(fields, says):
    found = problems(job({"region": "lab", "base_url": URL, **fields}))
    assert any(says in p for p in found), found


def test_what_plan_says_of_learning_deployments():
    ds = [deployment(tpm="auto", tpm_ceiling=90_000, rpm=60), deployment(region="self"),
          deployment(region="fixed", tpm=1000, rpm=10)]
    found = learning(ds)
    assert [f["region"] for f in found] == ["lab", "self"]
    assert "TPM learned from 30,000 up to 90,000" in found[0]["how"] and "RPM 60" in found[0]["how"]
    assert "adaptive concurrency from 1 (1-64)" in describe(ds[1])


def test_openai_headers_say_limits_remaining_counts_and_resets():
    said = rate_headers({"x-ratelimit-limit-tokens": "450000", "x-ratelimit-remaining-tokens": "449000",
                         "x-ratelimit-reset-tokens": "6m0s", "x-ratelimit-limit-requests": "5000",
                         "x-ratelimit-remaining-requests": "4999", "x-ratelimit-reset-requests": "12ms"}, 60)
    assert said == {"tokens_limit": 450000, "tokens_remaining": 449000, "tokens_reset": 360.0,
                    "requests_limit": 5000, "requests_remaining": 4999, "requests_reset": 0.012}


def test_azure_says_only_what_remains():
    assert rate_headers({"x-ratelimit-remaining-tokens": "1200", "x-ratelimit-remaining-requests": "7"}, 60) == \
        {"tokens_remaining": 1200, "requests_remaining": 7}


def test_the_generic_form_is_requests_per_the_budgets_window():
    said = rate_headers({"ratelimit-limit": "100", "ratelimit-remaining": "40", "ratelimit-reset": "30",
                         "ratelimit-policy": "100;w=120"}, 60)
    assert said == {"requests_limit": 50.0, "requests_remaining": 40, "requests_reset": 30.0}
    assert rate_headers({"ratelimit-limit": "nonsense"}, 60) == {}
    assert rate_headers({}, 60) == {}


@pytest.mark.parametrize("text, seconds", [("1s", 1.0), ("6m0s", 360.0), ("20ms", 0.02), ("1h2m", 3720.0),
                                           ("2.5", 2.5), ("soon", None), ("", None), ("5x", None)])
def test_reset_durations(text, seconds):
    assert duration(text) == (pytest.approx(seconds) if seconds is not None else None)


@pytest.fixture
def catalogue(tmp_path, monkeypatch):
    path = tmp_path / "catalogue.json"
    path.write_text(json.dumps({"deployments": {
        "gpt": {"region": "gpt", "base_url": URL, "tpm": "auto", "rpm": "auto", "tpm_ceiling": 400_000,
                "rpm_ceiling": 2_000},
        "vllm": {"region": "vllm", "base_url": URL, "concurrency": {"start": 2, "max": 16}}}, "inline": "deny"}))
    monkeypatch.setenv(CATALOGUE_ENV, str(path))
    monkeypatch.delenv(INLINE_ENV, raising=False)
    return path


def test_a_job_may_lower_a_learned_limit_below_its_ceiling_and_never_raise_it(catalogue):
    parsed = parse_job(job({"use": "gpt", "tpm": 50_000}, {"use": "vllm", "tpm": 9_000}))
    gpt, vllm = parsed.judges["j"].deployments
    assert gpt.tpm == 50_000 and gpt.rpm == "auto" and gpt.tpm_ceiling is None
    assert vllm.capacity == "adaptive" and vllm.tpm == 9_000  # the catalogue's mode, the job's lower TPM
    ran = govern(JudgeConfig.model_validate(parsed.judges["j"].model_dump()), "job1").deployments
    assert ran[0].tpm == "auto" and ran[0].own_limit == ("job1", 50_000, 2_000)
    assert ran[1].capacity == "adaptive" and ran[1].own_limit == ("job1", 9_000, bounds.MAX_RPM)
    found = problems(job({"use": "gpt", "tpm": 500_000}))
    assert any("more than the 400000" in p for p in found), found
    found = problems(job({"use": "gpt", "rpm": "auto"}))
    assert any("a whole number > 0" in p for p in found), found


def test_plan_says_which_deployments_learn_and_from_where(monkeypatch):
    from evalq.cli.capacity import plan_job, render

    monkeypatch.setenv("TEST_UNIT_API_KEY", "k")
    raw = job({"region": "gpt", "base_url": URL, "tpm": "auto", "tpm_floor": 60_000, "rpm": 600},
              {"region": "vllm", "base_url": "http://127.0.0.1:8/v1"})
    lines = render(plan_job(parse_job(raw), window_s=3600))
    said = [line for line in lines if "learns its capacity" in line]
    assert len(said) == 2, lines
    assert "gpt learns its capacity while it runs: TPM learned from 60,000" in said[0]
    assert "vllm learns its capacity while it runs: adaptive concurrency from 1 (1-64)" in said[1]
    fixed = render(plan_job(parse_job(job({"region": "lab", "base_url": URL, "tpm": 1000, "rpm": 10})), 3600))
    assert not [line for line in fixed if "learns" in line]


def test_plan_holds_a_self_hosted_deployment_by_its_calls_in_flight(monkeypatch, redis_url):
    """Issue 74, item 4: a self-hosted deployment with no quota was planned at 200M TPM / 1M RPM, and
    plan recommended 307 workers for 400 calls. It is held by its calls in flight: the adaptive
    limit's max (64), or what the cluster learned, at the seconds per call given, or learned."""
    import uuid

    import redis

    from evalq.cli.capacity import THREADS_PER_JUDGE_WORKER, cluster_learned, plan_job, render
    from evalq.shared.cluster import keys
    from evalq.shared.judging.judges import deployment_id

    monkeypatch.setenv("TEST_UNIT_API_KEY", "k")
    raw = job({"region": "vllm", "base_url": f"http://127.0.0.1:8/{uuid.uuid4().hex}/v1"})
    raw["instances"] = [{"id": str(i), "input": "q", "actual-output": "a"} for i in range(400)]
    parsed = parse_job(raw)
    plan = plan_job(parsed, 3600, call_seconds=0.5)
    (e,), (q,) = plan["endpoints"], plan["queues"]
    assert e["calls"] == pytest.approx(400) and e["in_flight"] == 64 and q["limited_by"] == "concurrency"
    assert e["seconds"] == pytest.approx(400 * 0.5 / 64)
    assert q["workers"] == 64 // THREADS_PER_JUDGE_WORKER == 4  # its 64 calls in flight need 4, not 307
    assert any("vllm" in line and "CONCURRENCY" in line and "-> 4 worker(s)" in line for line in render(plan))
    assert any("no quota; 400 calls x 0.5 s, 64 at a time = 0.1 min" in line for line in render(plan))
    r = redis.Redis.from_url(redis_url)
    dep = deployment_id(parsed.judges["j"], parsed.judges["j"].deployments[0])
    r.hset(keys.budget(dep, "adapt"), "limit", 8)
    r.hset(keys.budget(dep, "adapt:base"), mapping={"rating": 0.2, "short": 0.05})
    try:
        learned = plan_job(parsed, 3600, learned=cluster_learned(r))
    finally:
        r.delete(keys.budget(dep, "adapt"), keys.budget(dep, "adapt:base"))
    (e,), (q,) = learned["endpoints"], learned["queues"]
    assert (e["in_flight"], e["call_seconds"]) == (8, 0.2) and e["seconds"] == pytest.approx(400 * 0.2 / 8)
    assert q["workers"] == 1
    assert any("the cluster has learned 8 calls in flight, 0.2 s per call" in line for line in render(learned))


def test_plan_with_a_broker_plans_at_what_the_cluster_learned(monkeypatch, redis_url, tmp_path):
    """Issue 74, item 4: after the cluster learned 199,421 TPM, plan still estimated at the 30,000 floor.
    With ``--broker`` it reads the deployment's learned limits from the cluster's Redis."""
    import subprocess
    import sys
    import uuid

    import redis

    from evalq.cli.capacity import cluster_learned, plan_job, render
    from evalq.shared.cluster import keys
    from evalq.shared.judging.judges import deployment_id
    from tests.conftest import ROOT

    monkeypatch.setenv("TEST_UNIT_API_KEY", "k")
    raw = job({"region": "gpt", "base_url": f"http://127.0.0.1:9/{uuid.uuid4().hex}/v1", "tpm": "auto",
               "tpm_floor": 30_000, "rpm": 600})
    parsed = parse_job(raw)
    judge = parsed.judges["j"]
    r = redis.Redis.from_url(redis_url)
    key = keys.budget(deployment_id(judge, judge.deployments[0]), "learn")
    before = plan_job(parsed, 3600, learned=cluster_learned(r))  # nothing learned yet: the floor
    r.hset(key, mapping={"tpm": 199_421, "rpm": 5_000})  # rpm is stated (600): not a learned axis
    try:
        after = plan_job(parsed, 3600, learned=cluster_learned(r))
        path = tmp_path / "job.json"
        path.write_text(json.dumps(raw))
        shown = subprocess.run([sys.executable, "-m", "evalq.cli", "plan", str(path), "--broker", redis_url],
                               cwd=ROOT, capture_output=True, text=True, timeout=60)
    finally:
        r.delete(key)
    (e0,), (e1,) = before["endpoints"], after["endpoints"]
    assert (e0["tpm"], e1["tpm"], e1["rpm"]) == (30_000, 199_421, 600) and e0["tokens"] == e1["tokens"] > 0
    assert e1["minutes_at_tpm"] == pytest.approx(e1["tokens"] / 199_421)
    assert any("gpt: the cluster has learned TPM 199,421" in line for line in render(after))
    assert not any("learned TPM" in line for line in render(before))
    assert shown.returncode == 0 and "the cluster has learned TPM 199,421" in shown.stdout, shown.stderr
