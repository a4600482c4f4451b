"""Bounded work per item in a real cluster (embedded `evalq run`: a private Redis, a
prefork cpu worker): a 20k-token ROUGE-L item and a metric that runs away on some
items each get an error on that item, quickly, while every other item is scored;
and log.jsonl's lines carry their entry's parameters, whose size is bounded."""

from __future__ import annotations

import json
import time

import pytest

from evalq.shared.core import bounds
from tests.conftest import evalq, read_log, write_job

pytestmark = pytest.mark.integration

BUDGET = 1.0  # EVALQ_ITEM_TIMEOUT for this cluster
HANG = 3600.0  # what a hanging item would take without it: the run would not end at all
SLOW = 60.0  # an entry's time that tells "cut at its budget" from "ran its course" on any machine
WEIGHTS = [0.1] * bounds.MAX_BLEU_ORDER


def long_text(tokens: int) -> str:
    return " ".join(f"w{k % 997}" for k in range(tokens))


INSTANCES = ([{"id": f"ok{k}", "actual-output": f"the cat sat on mat {k}", "expected-output": [f"the cat sat {k}"]}
              for k in range(6)]
             + [{"id": "big", "actual-output": long_text(20_000), "expected-output": [long_text(20_000)]},
                {"id": "hang", "actual-output": "HANG here", "expected-output": ["x"]}])
METRICS = [{"id": "rouge", "parameters": {"rouge_types": ["rouge1", "rougeL"]}},
           {"id": "hang_on", "parameters": {"seconds": HANG}},
           {"id": "bleu", "parameters": {"weights": WEIGHTS, "smoothing_function": "method1"}},
           {"id": "bleu", "parameters": {"weights": [0.5, 0.5]}}]


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bounds")
    job = write_job(tmp / "job.json", INSTANCES, METRICS)
    t0 = time.monotonic()
    proc = evalq("run", str(job), "--out", str(tmp / "out"), "--concurrency", "2", "-q",
                 env={bounds.ITEM_TIMEOUT_ENV: str(BUDGET)}, timeout=240)
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    results = json.loads((tmp / "out" / "results.json").read_text())
    return results, read_log(tmp / "out"), (tmp / "out" / "log.jsonl").read_text(), wall


def lines_of(log: list[dict], entry: int) -> dict[str, dict]:
    return {line["instance_id"]: line for line in log if line["entry"] == entry}


def test_a_20k_token_rouge_l_item_errors_quickly_and_the_others_are_scored(ran):
    results, log, _, wall = ran
    rouge = lines_of(log, 0)
    assert "over the limit of 2000 per text for rougeL" in rouge["big"]["error"]
    assert bounds.ROUGE_L_TOKENS_ENV in rouge["big"]["error"]
    assert all("result" in rouge[f"ok{k}"] for k in range(6)) and "result" in rouge["hang"]
    assert (results[0]["n"], results[0]["n_errors"]) == (7, 1)
    assert results[0]["elapsed_time"] < SLOW  # the whole entry; the LCS of 20k x 20k tokens takes minutes
    assert wall < HANG  # nothing waited for the hanging item either


def test_a_metric_that_runs_away_gets_an_item_error_after_the_budget_and_the_job_goes_on(ran):
    results, log, _, _ = ran
    hang = lines_of(log, 1)
    assert hang["hang"]["error"] == (f"ItemTimeout: the item took longer than {BUDGET:g} s, the time budget per "
                                     f"item ({bounds.ITEM_TIMEOUT_ENV} raises it)")
    assert all(hang[i["id"]].get("result") == 1.0 for i in INSTANCES if i["id"] != "hang")
    assert (results[1]["n"], results[1]["n_errors"]) == (7, 1)
    assert BUDGET <= results[1]["elapsed_time"] < SLOW
    assert all(r["n"] + r["n_errors"] == len(INSTANCES) for r in results)  # every entry ran to the end


def test_log_lines_carry_their_entry_and_its_bounded_parameters(ran):
    """As in HarpIA's log, each line reproduces its entry's parameters as run; the largest BLEU
    weights a job may give (bounds.MAX_BLEU_ORDER) cost a line no more than their bounded size."""
    results, log, text, _ = ran
    assert [r["parameters"]["weights"] for r in results[2:]] == [WEIGHTS, [0.5, 0.5]]
    assert len(log) == len(METRICS) * len(INSTANCES)
    for k, result in enumerate(results):
        lines = [line for line in log if line["entry"] == k]
        assert {line["metric"] for line in lines} == {result["metric"]}
        assert all(line["parameters"] == result["parameters"] for line in lines)
    params = len(json.dumps(results[2]["parameters"]))
    assert all(len(line) < params + 400 for line in text.splitlines() if '"entry": 2' in line)