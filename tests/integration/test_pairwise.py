"""Issue 61: pairwise comparison on a cluster, against judge-sim told known biases: the figures evalq
reports (first position's win rate, flip rate under the swap, the longer answer's win rate) equal the
simulator's truth within their intervals; a judge that prefers a seat makes ties, not wins, of equal
answers; a better answer wins in both orders; asked once, no flip is measured."""

from __future__ import annotations

import os
import uuid

import pytest

from evalq.cli.run import run_job
from evalq.shared.job.schema import parse_job
from evalq.sim import Biases, JudgeSim, Region
from evalq.sim.pairwise import truth
from tests.conftest import read_log, read_results, running_worker

pytestmark = pytest.mark.integration

SECRET = "sk-pairwise-" + uuid.uuid4().hex
KEY_ENV = "TEST_PAIRWISE_API_KEY"
SEAT = Biases(first=0.7)
LENGTH = Biases(longer=0.68)
N = 300


@pytest.fixture(scope="module")
def sim():
    biases = {"judge-seat": SEAT, "judge-length": LENGTH, "judge-fair": Biases()}
    with JudgeSim([Region("pw")], latency=0.0, api_key=SECRET, seed=11, biases=biases) as s:
        yield s


@pytest.fixture(scope="module")
def judge_worker(redis_url, tmp_path_factory):
    os.environ[KEY_ENV] = SECRET
    yield from running_worker(redis_url, "judge.pw", tmp_path_factory.mktemp("pairwise-workers"), "pairwise",
                              concurrency=8)


def job(sim, model: str, pairs: list[tuple[str, str]], **params) -> object:
    instances = [{"id": f"p{i}", "input": f"Question {i}?", "actual-output": cand, "baseline-output": base}
                 for i, (cand, base) in enumerate(pairs)]
    return parse_job({
        "instances": instances,
        "judges": {"j": {"provider": "openai", "model": model, "api_key_env": KEY_ENV, "output": "json_schema",
                         "max_tokens": 100, "timeout": 5,
                         "deployments": [{"region": "pw", "base_url": sim.base_url("pw"), "tpm": 100_000_000,
                                          "rpm": 1_000_000}]}},
        "judging": {"cache": False},
        "metrics": [{"id": "pairwise", "parameters": {"judge": "j", **params}}]})


def within(result: dict, field: str, value: float) -> None:
    lo, hi = result[f"{field}_ci95"]
    assert lo <= value <= hi, (field, result[field], (lo, hi), value)


def test_a_judge_that_prefers_the_first_seat_is_measured_and_makes_no_winner(sim, judge_worker, redis_url, tmp_path):
    same = [(f"Answer number {i:03d}.", f"Answer number {i + 500:03d}.") for i in range(N)]  # equal, one length
    run_job(job(sim, "judge-seat", same), tmp_path, broker=redis_url, progress=False, stall_timeout=180)
    result = read_results(tmp_path)["pairwise"]
    score, want = result["score"], truth(SEAT)
    assert result["n"] == N and score["verdicts"] == 2 * N
    within(score, "first_position_win_rate", want["first_position_win_rate"])
    within(score, "flip_rate", want["flip_rate"])
    # the seat's wins cancel out over the swap: neither answer wins more often than the other
    assert abs(score["win_rate"] - score["loss_rate"]) < 0.12 and score["tie_rate"] == pytest.approx(score["flip_rate"])
    within(score, "score", 0.5)
    assert "longer_win_rate" not in score  # no pair differed in length
    line = read_log(tmp_path)[0]
    assert [v["first"] for v in line["result"]["verdicts"]] == ["candidate", "baseline"]


def test_the_longer_answers_advantage_is_measured(sim, judge_worker, redis_url, tmp_path):
    pairs = [(f"Answer {i} with a great many more words in it than the other.", f"Answer {i}.") for i in range(N)]
    run_job(job(sim, "judge-length", pairs), tmp_path, broker=redis_url, progress=False, stall_timeout=180)
    score = read_results(tmp_path)["pairwise"]["score"]
    within(score, "longer_win_rate", LENGTH.longer)
    within(score, "first_position_win_rate", 0.5)
    assert score["win_rate"] > score["loss_rate"]  # here the candidate is the longer one


def test_a_better_answer_wins_in_both_orders_and_asked_once_no_flip_is_counted(sim, judge_worker, redis_url,
                                                                               tmp_path):
    pairs = [(f"Good {i} [[sim:quality=0.9]]", f"Poor {i} [[sim:quality=0.1]]") for i in range(40)]
    run_job(job(sim, "judge-seat", pairs), tmp_path / "both", broker=redis_url, progress=False, stall_timeout=180)
    score = read_results(tmp_path / "both")["pairwise"]["score"]
    assert (score["win_rate"], score["flip_rate"], score["first_position_win_rate"]) == (1.0, 0.0, 0.5)
    run_job(job(sim, "judge-fair", pairs, swap=False), tmp_path / "once", broker=redis_url, progress=False,
            stall_timeout=180)
    once = read_results(tmp_path / "once")["pairwise"]["score"]
    assert once["win_rate"] == 1.0 and once["verdicts"] == 40 and "flip_rate" not in once
