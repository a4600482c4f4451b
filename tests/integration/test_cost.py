"""Cost in money against judge-sim, with real worker processes: results.json's and
run.json's ``cost`` equal the tokens (as judge-sim counted them, and as results.json
reports them) times their prices, and ``judging.cost_cap`` stops paying."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import pytest
import redis

from evalq.cli.run import run_job
from evalq.orchestrator.jobs import job_status, render
from evalq.shared.cluster import keys
from evalq.shared.job.schema import parse_job
from evalq.shared.judging.judges import Price
from evalq.sim import JudgeSim, Region
from evalq.workers.judge.cost import CostCap, CostCapReached, CostWait
from tests.conftest import read_log, read_results, running_worker

pytestmark = pytest.mark.integration

SECRET = "sk-evalq-test-" + uuid.uuid4().hex
KEY_ENV = "TEST_COST_API_KEY"
REGIONS = ("lab", "eu", "gen")  # two judge deployments, and the model under test's own
DAILY = 1.5


@pytest.fixture(scope="module")
def sim():
    with JudgeSim([Region(r) for r in REGIONS], latency=0.005, api_key=SECRET, seed=5) as s:
        yield s


@pytest.fixture(scope="module")
def worker(redis_url, tmp_path_factory):
    os.environ[KEY_ENV] = SECRET  # validation in this process checks the key variable is set
    # tenant 'ads' may spend DAILY a UTC day across its jobs (the operator's policy, on the workers)
    yield from running_worker(redis_url, "judge.lab,judge.eu,generate.gen", tmp_path_factory.mktemp("cost-workers"),
                              "cost", concurrency=8, env={"EVALQ_TENANTS": f"ads=1;ads.daily_cost={DAILY}"})


def endpoint(sim, regions, price=None, deployment_prices=None, max_tokens=100, **extra) -> dict:
    deployment_prices = deployment_prices or {}
    cfg = {"provider": "openai", "model": "judge-sim", "api_key_env": KEY_ENV, "max_tokens": max_tokens,
           "max_retries": 1, "timeout": 5,
           "deployments": [{"region": r, "base_url": sim.base_url(r), "tpm": 10_000_000, "rpm": 100_000,
                            **({"price": deployment_prices[r]} if r in deployment_prices else {})}
                           for r in regions], **extra}
    if price is not None:
        cfg["price"] = price
    return cfg


def run(job: dict, out: Path, redis_url: str, chunk_size: int | None = None) -> None:
    run_job(parse_job(job), out, broker=redis_url, chunk_size=chunk_size, progress=False, stall_timeout=120)


def money(prompt: int, completion: int, price: dict) -> float:
    """What the test expects: tokens times price per 1,000 (computed here, not by evalq)."""
    return prompt * price["input_per_1k"] / 1000 + completion * price["output_per_1k"] / 1000


JUDGE_PRICE = {"input_per_1k": 0.5, "output_per_1k": 1.5}
EU_PRICE = {"input_per_1k": 2.0, "output_per_1k": 4.0}   # the eu deployment's own: it wins over the judge's
MODEL_PRICE = {"input_per_1k": 0.25, "output_per_1k": 0.75}


def test_results_and_run_json_carry_the_cost(sim, worker, redis_url, tmp_path):
    sim.reset_stats()
    tag = uuid.uuid4().hex
    n = 8
    job = {"instances": [{"id": f"q{i}", "input": f"Question {i} {tag}?", "context": f"Context {i}."}
                         for i in range(n)],
           "model": {**endpoint(sim, ["gen"], MODEL_PRICE, max_tokens=40), "cache": False},
           "judges": {"sim": endpoint(sim, ["lab", "eu"], JUDGE_PRICE, {"eu": EU_PRICE}, output="text")},
           "judging": {"cache": False},
           "metrics": [{"id": "fluency", "parameters": {"judge": "sim"}},
                       {"id": "coherence", "parameters": {"judge": "sim"}}]}
    run(job, tmp_path, redis_url, chunk_size=2)  # chunks alternate between lab and eu
    results = json.loads((tmp_path / "results.json").read_text())
    run_json = json.loads((tmp_path / "run.json").read_text())
    price_of = {"lab": JUDGE_PRICE, "eu": EU_PRICE}
    for entry in results:
        judge = entry["judge"]
        assert set(judge["regions"]) == {"lab", "eu"}, judge  # both prices are exercised
        for region, counts in judge["regions"].items():
            assert counts["calls"] > 0
            assert counts["cost"] == pytest.approx(
                money(counts["prompt_tokens"], counts["completion_tokens"], price_of[region]), abs=2e-6)
        assert judge["cost"] == pytest.approx(sum(c["cost"] for c in judge["regions"].values()), abs=2e-6)
        # the override matters: the judge's price alone gives another total
        assert judge["cost"] != pytest.approx(money(judge["prompt_tokens"], judge["completion_tokens"],
                                                    JUDGE_PRICE), abs=1e-4)
    gen = run_json["generation"]["judge"]
    assert gen["calls"] == n
    assert gen["cost"] == pytest.approx(money(gen["prompt_tokens"], gen["completion_tokens"], MODEL_PRICE), abs=1e-6)
    assert run_json["cost"] == pytest.approx(sum(e["judge"]["cost"] for e in results) + gen["cost"], abs=1e-6)

    # judge-sim's own count of the tokens it answered, region by region
    stats = sim.stats()
    assert gen["cost"] == pytest.approx(money(stats["gen"]["prompt_tokens"], stats["gen"]["completion_tokens"],
                                              MODEL_PRICE), abs=1e-6)
    for region in ("lab", "eu"):
        paid = sum(e["judge"]["regions"][region]["cost"] for e in results)
        assert paid == pytest.approx(money(stats[region]["prompt_tokens"], stats[region]["completion_tokens"],
                                           price_of[region]), abs=1e-5)
    assert run_json["cost"] == pytest.approx(sum(money(stats[r]["prompt_tokens"], stats[r]["completion_tokens"],
                                                       p) for r, p in (*price_of.items(), ("gen", MODEL_PRICE))),
                                             abs=1e-5)
    for name in ("results.json", "run.json"):
        assert "cost_nano" not in (tmp_path / name).read_text()
    report = (tmp_path / "report.html").read_text()
    assert "<th>cost</th>" in report and str(results[0]["judge"]["cost"]) in report

    # evalq status shows what each entry cost so far (here: all of it)
    info = job_status(redis.Redis.from_url(redis_url), run_json["job_id"])
    shown = {row["entry"]: row["judge"]["cost"] for row in info["entries"]}
    assert shown["generate"] == gen["cost"]
    assert sorted(v for k, v in shown.items() if k != "generate") == sorted(e["judge"]["cost"] for e in results)
    assert f"cost {gen['cost']}" in render(info, one=True)


def test_no_price_means_no_cost(sim, worker, redis_url, tmp_path):
    tag = uuid.uuid4().hex
    job = {"instances": [{"id": f"q{i}", "input": "q", "actual-output": f"{tag} {i}"} for i in range(2)],
           "judges": {"sim": endpoint(sim, ["lab"], output="text")}, "judging": {"cache": False},
           "metrics": [{"id": "fluency", "parameters": {"judge": "sim"}}]}
    run(job, tmp_path, redis_url)
    judge = read_results(tmp_path)["fluency"]["judge"]
    assert judge["calls"] == 2
    assert "cost" not in judge and "cost" not in judge["regions"]["lab"]
    assert json.loads((tmp_path / "run.json").read_text())["cost"] is None


def cost_capped_items(log: list[dict], cap: float) -> list[dict]:
    return [line for line in log if f"job cost cap of {cap} reached" in line.get("error", "")]


def test_cost_cap_stops_paying_and_the_rest_are_errors(sim, worker, redis_url, tmp_path):
    sim.reset_stats("lab")
    tag = uuid.uuid4().hex
    n, max_tokens, cap = 16, 100, 0.2
    price = {"input_per_1k": 0.0, "output_per_1k": 1.0}  # a call's worst case is exactly 100 tokens: 0.1
    worst = max_tokens * price["output_per_1k"] / 1000
    job = {"instances": [{"id": f"q{i}", "input": "q", "actual-output": f"{tag} {i}"} for i in range(n)],
           "judges": {"sim": endpoint(sim, ["lab"], price, max_tokens=max_tokens, output="text")},
           "judging": {"cache": False, "cost_cap": cap},
           "metrics": [{"id": "fluency", "parameters": {"judge": "sim"}}]}
    run(job, tmp_path, redis_url)
    log = read_log(tmp_path)
    capped = cost_capped_items(log, cap)
    scored = [line for line in log if "result" in line]
    assert capped and scored and len(capped) + len(scored) == n, log
    assert all(line["error"].startswith("CostCapReached: ") for line in capped)
    result = read_results(tmp_path)["fluency"]
    assert (result["n"], result["n_errors"]) == (len(scored), len(capped))
    judge = result["judge"]
    paid = money(judge["prompt_tokens"], judge["completion_tokens"], price)
    assert judge["cost"] == pytest.approx(paid, abs=1e-6)
    stats = sim.stats("lab")
    assert stats["ok"] == len(scored) == judge["calls"]
    assert money(stats["prompt_tokens"], stats["completion_tokens"], price) == pytest.approx(paid, abs=1e-6)
    assert paid <= cap + worst
    assert json.loads((tmp_path / "run.json").read_text())["cost"] == judge["cost"]


def test_cost_cap_bounds_generation_too(sim, worker, redis_url, tmp_path):
    sim.reset_stats("gen")
    tag = uuid.uuid4().hex
    n, cap = 8, 0.05
    price = {"input_per_1k": 0.0, "output_per_1k": 1.0}  # a generation call's worst case: 40 tokens, 0.04
    job = {"instances": [{"id": f"q{i}", "input": f"Question {i} {tag}?"} for i in range(n)],
           "model": {**endpoint(sim, ["gen"], price, max_tokens=40), "cache": False},
           "judges": {"sim": endpoint(sim, ["lab"], output="text")},  # no price: the model's alone count
           "judging": {"cache": False, "cost_cap": cap},
           "metrics": [{"id": "fluency", "parameters": {"judge": "sim"}}]}
    run(job, tmp_path, redis_url)
    log = read_log(tmp_path)
    generated = [line for line in log if line["metric"] == "generate"]
    not_generated = cost_capped_items(generated, cap)
    assert not_generated and len(not_generated) < n, generated
    fluency = [line for line in log if line["metric"] == "fluency"]
    failed = cost_capped_items(fluency, cap)  # "the model under test gave no output: CostCapReached: ..."
    assert {line["instance_id"] for line in failed} == {line["instance_id"] for line in not_generated}
    assert read_results(tmp_path)["fluency"]["n_errors"] == len(failed)
    gen = json.loads((tmp_path / "run.json").read_text())["generation"]
    assert gen["n_errors"] == len(not_generated)
    assert gen["judge"]["cost"] <= cap + 0.04
    assert sim.stats("gen")["ok"] == gen["judge"]["calls"] == n - len(not_generated)


# --- the counter itself, on a real Redis ----------------------------------------------------

def test_cost_cap_holds_the_worst_case_and_settles_to_the_cost(redis_url):
    r = redis.Redis.from_url(redis_url)
    job_id = uuid.uuid4().hex
    cap = CostCap(r, job_id, 1.0)
    price = Price(input_per_1k=1.0, output_per_1k=2.0)
    spent = lambda: int(r.get(keys.job_cost(job_id)) or 0)  # noqa: E731
    held = cap.hold(price, 100, 200)  # 0.1 + 0.4, held apart from what was spent
    assert held.amount == 500_000_000 and spent() == 0 and r.hlen(keys.cost_held(keys.job_cost(job_id))) == 1
    cap.settle(held, 123_000_000)  # the reply cost 0.123
    assert spent() == 123_000_000 and r.hlen(keys.cost_held(keys.job_cost(job_id))) == 0
    second = cap.hold(price, 100, 200)
    with pytest.raises(CostWait):
        cap.hold(price, 100, 200)  # 0.123 + 0.5 in flight + 0.5 > 1, but 0.123 + 0.5 fits: wait for it
    cap.release(second)  # that call failed
    assert spent() == 123_000_000 and r.hlen(keys.cost_held(keys.job_cost(job_id))) == 0
    third = cap.hold(price, 100, 200)
    cap.settle(third, 600_000_000)  # a real cost above the estimate is counted, never past the hold
    with pytest.raises(CostCapReached, match=r"^job cost cap of 1 reached$"):
        cap.hold(price, 100, 200)  # 0.723 + 0.5 > 1 with nothing in flight: refused, holding nothing
    assert spent() == 723_000_000
    assert cap.hold(None, 10**6, 10**6) is None  # no price: nothing held
    assert CostCap(r, job_id, None).hold(price, 100, 200) is None  # no cap: nothing held
    # a hold whose worker died lapses: it stops standing in the way
    r.delete(keys.job_cost(job_id))
    lapsing = CostCap(r, job_id, 1.0).hold(price, 200, 200, lapse=0.5)  # 0.6
    with pytest.raises(CostWait):
        cap.hold(price, 200, 200)
    time.sleep(0.6)
    assert cap.hold(price, 200, 200) is not None and lapsing is not None
    r.delete(keys.job_cost(job_id), keys.cost_held(keys.job_cost(job_id)))


def test_a_tenants_daily_spend_holds_across_its_jobs(sim, worker, redis_url, tmp_path):
    """Spend limits are the operator's and hold across a tenant's jobs: two jobs of tenant 'ads'
    together spend at most its daily_cost; their items past it carry the limit's error; a job of
    another tenant on the same judge is not held by it."""
    import datetime

    import redis

    r = redis.Redis.from_url(redis_url)
    day = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    r.delete(f"evalq:tenant:ads:cost:{day}")
    tag = uuid.uuid4().hex

    def job(tenant: str, k: int) -> dict:
        return {"instances": [{"id": f"{tenant}{k}-{i}", "input": f"Question {i} {tag} {k}?", "actual-output": "An answer.",
                               "context": "Context."} for i in range(10)],
                "judges": {"sim": endpoint(sim, ["lab"], JUDGE_PRICE, output="text")}, "judging": {"cache": False},
                "scheduling": {"tenant": tenant}, "metrics": [{"id": "coherence", "parameters": {"judge": "sim"}}]}

    costs, errors = [], []
    for k in range(2):
        run(job("ads", k), tmp_path / f"ads{k}", redis_url, chunk_size=5)
        result = json.loads((tmp_path / f"ads{k}" / "results.json").read_text())[0]
        costs.append(result["judge"]["cost"])
        errors += [line["error"] for line in read_log(tmp_path / f"ads{k}") if "error" in line]
    assert 0 < sum(costs) <= DAILY  # what both jobs paid, together
    assert costs[0] > 0 and errors  # the first spent up to the limit; the rest of the items were refused
    assert all(e == f"CostCapReached: tenant 'ads''s daily cost limit of {DAILY:g} reached (EVALQ_TENANTS)"
               for e in errors), errors[:2]
    assert len(errors) == 20 - sum(json.loads((tmp_path / f"ads{k}" / "results.json").read_text())[0]["n"]
                                   for k in range(2))
    run(job("search", 0), tmp_path / "search", redis_url, chunk_size=5)
    other = json.loads((tmp_path / "search" / "results.json").read_text())[0]
    assert (other["n"], other["n_errors"]) == (10, 0)
