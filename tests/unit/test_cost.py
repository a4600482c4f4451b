"""Cost in money: the ``price`` model and its validation, the cost arithmetic, and how
accounting hashes become the ``cost`` of results.json and run.json."""

from __future__ import annotations

import json

import pytest

from evalq.results.summary import judge_accounting
from evalq.shared.job.stored import StoredJob
from evalq.results.outputs import job_cost
from evalq.shared.core.errors import JobError
from evalq.shared.job.schema import parse_job
from evalq.shared.judging.judges import JudgeConfig, Price
from tests.conftest import evalq

KEY_ENV = "TEST_UNIT_API_KEY"  # set by tests/conftest.py
INSTANCE = {"id": "1", "input": "q", "actual-output": "a"}


def judge(price=None, deployment_prices=(None,)) -> dict:
    cfg = {"provider": "openai", "model": "m", "api_key_env": KEY_ENV,
           "deployments": [{"region": f"r{i}", "base_url": "http://127.0.0.1:9/v1", "tpm": 1000, "rpm": 10,
                            **({"price": p} if p is not None else {})} for i, p in enumerate(deployment_prices)]}
    if price is not None:
        cfg["price"] = price
    return cfg


def job(judge_cfg: dict, judging: dict | None = None, **extra) -> dict:
    return {"instances": [INSTANCE], "judges": {"j": judge_cfg}, "judging": judging or {},
            "metrics": [{"id": "fluency", "parameters": {"judge": "j"}}], **extra}


def problems(raw) -> list[str]:
    with pytest.raises(JobError) as info:
        parse_job(raw, source="job.json")
    return info.value.problems


# --- the model and its validation ------------------------------------------------------

def test_a_price_is_read_onto_judge_and_deployment():
    parsed = parse_job(job(judge({"input_per_1k": 0.5, "output_per_1k": 2},
                                 [None, {"input_per_1k": 1, "output_per_1k": 3}])))
    cfg = parsed.judges["j"]
    assert cfg.price == Price(input_per_1k=0.5, output_per_1k=2.0)
    first, second = cfg.deployments
    assert cfg.price_of(first) == cfg.price                      # no price of its own: the judge's
    assert cfg.price_of(second) == Price(input_per_1k=1, output_per_1k=3)  # its own wins
    assert cfg.priced


@pytest.mark.parametrize("price, where, message", [
    ({"input_per_1k": -0.1, "output_per_1k": 1}, "judges.j.price.input_per_1k", "greater than or equal to 0"),
    ({"input_per_1k": 1, "output_per_1k": -2}, "judges.j.price.output_per_1k", "greater than or equal to 0"),
    ({"input_per_1k": 1}, "judges.j.price.output_per_1k", "Field required"),
    ({"input_per_1k": 1, "output_per_1k": 1, "currency": "EUR"}, "judges.j.price.currency", "unknown field"),
    ({"input_per_1k": "1", "output_per_1k": 1}, "judges.j.price.input_per_1k", "valid number"),
    ({"input_per_1k": True, "output_per_1k": 1}, "judges.j.price.input_per_1k", "valid number"),
    ({"input_per_1k": 1, "output_per_1k": 1, "batch_input_per_1k": -1}, "judges.j.price.batch_input_per_1k",
     "greater than or equal to 0"),
    ("cheap", "judges.j.price", "valid dictionary"),
])
def test_a_bad_price_is_a_located_problem(price, where, message):
    found = problems(job(judge(price)))
    assert any(p.startswith(f"job.json: {where}: ") and message in p for p in found), found


def test_a_bad_deployment_price_names_the_deployment():
    found = problems(job(judge(None, [{"input_per_1k": 1, "output_per_1k": -1}])))
    assert any(p.startswith("job.json: judges.j.deployments.0.price.output_per_1k: ") for p in found), found


def test_the_model_under_test_takes_a_price():
    model = {**judge({"input_per_1k": 0.25, "output_per_1k": 1}), "prompt_template": "$model_input"}
    parsed = parse_job({"instances": [{"id": "1", "input": "q", "expected-output": ["a"]}], "model": model,
                        "metrics": [{"id": "exact_match"}]})
    assert parsed.model.price == Price(input_per_1k=0.25, output_per_1k=1)
    found = problems({"instances": [{"id": "1", "input": "q", "expected-output": ["a"]}],
                      "model": {**model, "price": {"input_per_1k": -1, "output_per_1k": 0}},
                      "metrics": [{"id": "exact_match"}]})
    assert any(p.startswith("job.json: model.price.input_per_1k: ") for p in found), found


@pytest.mark.parametrize("cap, message", [(0, "greater than 0"), (-1, "greater than 0"), ("1", "valid number")])
def test_a_bad_cost_cap_is_a_located_problem(cap, message):
    found = problems(job(judge({"input_per_1k": 1, "output_per_1k": 1}), {"cost_cap": cap}))
    assert any(p.startswith("job.json: judging.cost_cap: ") and message in p for p in found), found


def test_a_cost_cap_needs_a_price_somewhere():
    assert problems(job(judge(), {"cost_cap": 1.5})) == ["job.json: judging.cost_cap: no judge or model has a price"]
    # a price on one deployment, or on the model under test, is enough
    assert parse_job(job(judge(None, [None, {"input_per_1k": 0, "output_per_1k": 1}]),
                         {"cost_cap": 1.5})).judging.cost_cap == 1.5
    model = {**judge({"input_per_1k": 0.25, "output_per_1k": 1}), "prompt_template": "$model_input"}
    raw = {"instances": [{"id": "1", "input": "q"}], "judges": {"j": judge()}, "model": model,
           "judging": {"cost_cap": 2}, "metrics": [{"id": "fluency", "parameters": {"judge": "j"}}]}
    assert parse_job(raw).judging.cost_cap == 2


def test_a_bad_price_exits_2_at_the_cli(tmp_path):
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job(judge({"input_per_1k": -1, "output_per_1k": 1}))))
    proc = evalq("validate", str(path))
    assert proc.returncode == 2, proc.stderr
    assert "judges.j.price.input_per_1k" in proc.stderr and "Traceback" not in proc.stderr


# --- the arithmetic -----------------------------------------------------------------------

@pytest.mark.parametrize("inp, out, prompt, completion, expected", [
    (0.5, 1.5, 1000, 1000, 2.0),
    (0.003, 0.015, 1234, 567, 1234 * 0.003 / 1000 + 567 * 0.015 / 1000),
    (2.5, 10.0, 37, 0, 37 * 2.5 / 1000),
    (0, 0, 10**6, 10**6, 0.0),
    (0.0001, 0.0002, 1, 1, 0.0000003),
])
def test_cost_is_tokens_times_price_per_1000(inp, out, prompt, completion, expected):
    nano = Price(input_per_1k=inp, output_per_1k=out).cost_nano(prompt, completion)
    assert isinstance(nano, int)
    assert nano == pytest.approx(expected * 1e9, abs=0.5)


def test_batch_prices_default_to_half():
    price = Price(input_per_1k=3, output_per_1k=15)
    assert (price.batch().input_per_1k, price.batch().output_per_1k) == (1.5, 7.5)
    given = Price(input_per_1k=3, output_per_1k=15, batch_input_per_1k=1, batch_output_per_1k=0)
    assert (given.batch().input_per_1k, given.batch().output_per_1k) == (1, 0)


def acct(**fields: int) -> dict[bytes, bytes]:
    return {k.replace("__", "/").encode(): str(v).encode() for k, v in fields.items()}


def test_accounting_shows_cost_not_cost_nano():
    hash_ = acct(calls=3, prompt_tokens=300, cost_nano=1_234_567_891, eu__calls=2, eu__cost_nano=1_000_000_000,
                 us__calls=1, us__cost_nano=234_567_891)
    judge = judge_accounting(hash_, priced=True)
    assert judge["cost"] == 1.234568 and "cost_nano" not in judge
    assert judge["regions"] == {"eu": {"calls": 2, "cost": 1.0}, "us": {"calls": 1, "cost": 0.234568}}
    assert judge_accounting(hash_)["cost"] == 1.234568  # priced unknown: the hash says so


def test_no_price_no_cost_and_a_price_with_no_call_costs_zero():
    unpriced = judge_accounting(acct(calls=2, eu__calls=2), priced=False)
    assert "cost" not in unpriced and "cost" not in unpriced["regions"]["eu"]
    assert "cost" not in judge_accounting(acct(calls=2))
    cached = judge_accounting(acct(cache_hits=4, eu__calls=0), priced=True)
    assert cached["cost"] == 0.0 and cached["regions"]["eu"]["cost"] == 0.0


def test_endpoint_priced_reads_the_stored_spec():
    priced = JudgeConfig.model_validate({**judge(None, [None, {"input_per_1k": 0, "output_per_1k": 1}]),
                                         "output": "text"}).model_dump(mode="json")
    spec = {"judges": {"a": judge(), "b": priced},
            "model": {**judge({"input_per_1k": 1, "output_per_1k": 1}), "prompt_template": "$model_input"}}
    assert not StoredJob(spec).priced("fluency@0", {"parameters": {"judge": "a"}})
    assert StoredJob(spec).priced("fluency@1", {"parameters": {"judge": "b"}})
    assert StoredJob(spec).priced("generate", {"parameters": {}})
    assert not StoredJob({"model": {"runner": "m:C"}}).priced("generate", {"parameters": {}})


def test_job_cost_sums_judges_and_generation():
    summary = [{"judge": {"cost": 0.1}}, {"judge": {"calls": 3}}, {"score": 1.0}, {"judge": {"cost": 0.200001}}]
    assert job_cost(summary, {"judge": {"cost": 0.05}}) == 0.350001
    assert job_cost(summary, None) == 0.300001
    assert job_cost([{"judge": {"calls": 1}}], {"judge": {"calls": 1}}) is None
    assert job_cost([], None) is None
