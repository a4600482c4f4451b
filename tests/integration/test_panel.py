"""Issue 61: a panel of judges on a cluster, against judge-sim told each member's character (one
faithful, one lenient by a point, one noisy): each item is scored by every member, the log line keeps
each member's score and reason, results.json gives each member's mean, the panel's Krippendorff alpha
(equal to the ``krippendorff`` package's on the log's table) and its effective votes; two copies of
one judge are one vote and score as that judge alone; a member that fails leaves the item to a
quorum, or fails it naming who failed; and a panel and a pairwise comparison run embedded too."""

from __future__ import annotations

import json
import os
import uuid

import numpy as np
import pytest

from evalq.cli.run import run_job
from evalq.shared.job.schema import parse_job
from evalq.sim import Biases, JudgeSim, Region
from tests.conftest import read_log, read_results, running_worker

pytestmark = pytest.mark.integration
krippendorff = pytest.importorskip("krippendorff")

SECRET = "sk-panel-" + uuid.uuid4().hex
KEY_ENV = "TEST_PANEL_API_KEY"
MODELS = {"faithful": Biases(), "lenient": Biases(leniency=1), "noisy": Biases(noise=0.4)}
GENEROUS = {"generous": Biases(leniency=2)}  # two points up: a review's panel disagreement
N = 60


@pytest.fixture(scope="module")
def sim():
    with JudgeSim([Region("jury")], api_key=SECRET, seed=13, biases={**MODELS, **GENEROUS}) as s:
        yield s


@pytest.fixture(scope="module")
def judge_worker(redis_url, tmp_path_factory):
    os.environ[KEY_ENV] = SECRET
    yield from running_worker(redis_url, "judge.jury", tmp_path_factory.mktemp("panel-workers"), "panel",
                              concurrency=8)


def truth(i: int) -> int:
    return 1 + (i * 7) % 5


def judges(sim, **extra) -> dict:
    def one(model: str, base_url: str | None = None) -> dict:
        return {"provider": "openai", "model": model, "api_key_env": KEY_ENV, "output": "json_schema",
                "max_tokens": 100, "timeout": 5, "max_retries": 0,
                "deployments": [{"region": "jury", "base_url": base_url or sim.base_url("jury"), "tpm": 100_000_000,
                                 "rpm": 1_000_000}]}
    out = {name: one(name) for name in {**MODELS, **GENEROUS}}
    out["faithful_too"] = one("faithful")
    out["away"] = one("faithful", "http://127.0.0.1:9/v1")  # nothing listens there
    return {**out, **extra}


def run(sim, tmp_path, parameters: dict, redis_url) -> tuple[list[dict], dict]:
    instances = [{"id": f"q{i}", "input": f"Question {i}?", "actual-output": f"Answer {i} [[sim:score={truth(i)}]]",
                  "human": {"coherence": truth(i)}} for i in range(N)]
    job = parse_job({"instances": instances, "judges": judges(sim), "judging": {"cache": False},
                     "metrics": [{"id": "coherence", "parameters": parameters}]})
    run_job(job, tmp_path, broker=redis_url, progress=False, stall_timeout=180)
    return read_log(tmp_path), read_results(tmp_path)["coherence"]


def test_a_panel_of_three_keeps_each_member_and_says_what_it_is_worth(sim, judge_worker, redis_url, tmp_path):
    log, result = run(sim, tmp_path, {"judge": ["faithful", "lenient", "noisy"], "panel_aggregate": "median",
                                      "threshold": 4}, redis_url)
    assert len(log) == N and not [line for line in log if "error" in line]
    table = []
    for line in log:
        i, members = int(line["instance_id"][1:]), line["result"]["members"]
        assert members["faithful"]["score"] == truth(i) and members["lenient"]["score"] == min(5, truth(i) + 1)
        assert abs(members["noisy"]["score"] - truth(i)) <= 1 and members["noisy"]["reason"]
        scores = [members[m]["score"] for m in ("faithful", "lenient", "noisy")]
        assert line["result"]["score"] == np.median(scores) and line["result"]["panel"] == "median"
        table.append(scores)
    data = np.array(table, dtype=float).T
    panel = result["score"]["panel"]
    assert {m: p["mean"] for m, p in panel["members"].items()} == pytest.approx(dict(zip(MODELS, data.mean(axis=1))))
    assert panel["alpha"] == pytest.approx(krippendorff.alpha(reliability_data=data, level_of_measurement="ordinal"))
    rs = [np.corrcoef(data[i], data[j])[0, 1] for i, j in ((0, 1), (0, 2), (1, 2))]
    assert panel["effective_votes"] == pytest.approx(3 / (1 + 2 * np.mean(rs)))
    assert 1.0 < panel["effective_votes"] < 3.0  # correlated judges: fewer votes than members
    assert result["score"]["mean"] == pytest.approx(np.median(data, axis=0).mean())
    # against the people's grades (here the truth): each member's agreement, and the panel's
    agreement = result["agreement"]
    truths = np.array([truth(i) for i in range(N)])
    assert agreement["members"]["faithful"]["exact"] == 1.0
    assert agreement["members"]["lenient"]["exact"] == pytest.approx(np.mean(truths == 5))
    assert agreement["members"]["lenient"]["within_1"] == 1.0 and agreement["n"] == N
    # who judged: every member's identity, and the panel's own id
    identity = result["judge"]["identity"]
    assert set(identity["panel"]) == set(MODELS) and identity["aggregate"] == "median"
    assert identity["panel"]["lenient"]["versions"] == ["lenient"]


def test_two_copies_of_one_judge_are_one_vote_and_score_as_it_alone(sim, judge_worker, redis_url, tmp_path):
    _, alone = run(sim, tmp_path / "alone", {"judge": "faithful", "threshold": 4}, redis_url)
    log, twice = run(sim, tmp_path / "twice", {"judge": ["faithful", "faithful_too"], "threshold": 4}, redis_url)
    assert twice["score"]["mean"] == alone["score"]["mean"] and twice["score"]["pass_rate"] == alone["score"]["pass_rate"]
    assert twice["score"]["distribution"] == alone["score"]["distribution"]
    panel = twice["score"]["panel"]
    assert panel["alpha"] == pytest.approx(1.0) and panel["effective_votes"] == pytest.approx(1.0)
    assert "panel" not in alone["score"]


def test_a_member_that_fails_leaves_the_item_to_the_quorum_or_fails_it_saying_who(sim, judge_worker, redis_url,
                                                                                  tmp_path):
    log, result = run(sim, tmp_path / "quorum", {"judge": ["faithful", "lenient", "away"], "panel_quorum": 2},
                      redis_url)
    assert not [line for line in log if "error" in line]
    assert all("error" in line["result"]["members"]["away"] for line in log)
    assert result["score"]["panel"]["members"]["away"] == {"mean": None, "n": 0, "failed": N}
    log, result = run(sim, tmp_path / "all", {"judge": ["faithful", "away"]}, redis_url)
    assert result["n_errors"] == N
    assert all("the panel's quorum is 2 of 2 judges and 1 answered (away:" in line["error"] for line in log)


def test_a_panel_and_a_pairwise_comparison_run_embedded_too(sim, tmp_path):
    """No cluster: `evalq run` starts its own Redis and workers; the panel and the comparison score
    as on a cluster."""
    from tests.conftest import evalq

    instances = [{"id": f"q{i}", "input": f"Question {i}?", "actual-output": f"Answer {i} [[sim:score={truth(i)}]]",
                  "baseline-output": f"Baseline {i}."} for i in range(8)]
    path = tmp_path / "job.json"
    path.write_text(json.dumps({
        "instances": instances, "judges": judges(sim), "judging": {"cache": False},
        "metrics": [{"id": "coherence", "parameters": {"judge": ["faithful", "lenient"]}},
                    {"id": "pairwise", "parameters": {"judge": "faithful"}}]}))
    done = evalq("run", str(path), "--out", str(tmp_path / "out"), "-q",
                 env={KEY_ENV: SECRET, "EVALQ_ENDPOINTS": "*=http://127.0.0.1:*"})
    assert done.returncode == 0, done.stderr
    results = read_results(tmp_path / "out")
    members = results["coherence"]["score"]["panel"]["members"]
    assert members["faithful"]["mean"] == pytest.approx(np.mean([truth(i) for i in range(8)]))
    assert members["lenient"]["mean"] == pytest.approx(np.mean([min(5, truth(i) + 1) for i in range(8)]))
    assert results["pairwise"]["score"]["verdicts"] == 16 and results["pairwise"]["n"] == 8


def test_a_panel_nights_review_picks_the_items_its_members_disagree_on(sim, judge_worker, redis_url, tmp_path):
    """Issue 75: a night asks for 10 items for review; its panel's members (faithful, and generous by two
    points) disagree by two on every item whose true score is 3 or less: the 8 items chosen for a reason
    are such items, the other 2 are drawn at random, and the review file, run.json and the report say so."""
    instances = [{"id": f"q{i}", "input": f"Question {i}?", "actual-output": f"Answer {i} [[sim:score={truth(i)}]]"}
                 for i in range(N)]
    job = parse_job({"instances": instances, "judges": judges(sim), "judging": {"cache": False},
                     "review": {"items": 10, "random": 0.2},
                     "metrics": [{"id": "coherence", "parameters": {"judge": ["faithful", "generous"], "threshold": 4}}]})
    run_job(job, tmp_path, broker=redis_url, progress=False, stall_timeout=180)
    log = {line["instance_id"]: line for line in read_log(tmp_path)}
    disagree = {iid for iid, line in log.items()
                if abs(line["result"]["members"]["faithful"]["score"] - line["result"]["members"]["generous"]["score"]) >= 2}
    assert disagree == {f"q{i}" for i in range(N) if truth(i) <= 3}  # counted from the judges' own answers
    rows = [json.loads(line) for line in (tmp_path / "review.jsonl").read_text().splitlines()]
    assert len(rows) == 10 == len({row["instance_id"] for row in rows})
    first = [row for row in rows if row["reasons"][0]["reason"] != "at random"]
    drawn = [row for row in rows if row["reasons"][0]["reason"] == "at random"]
    assert len(first) == 8 and len(drawn) == 2
    assert all(row["reasons"][0]["reason"] == "panel disagreement" and row["instance_id"] in disagree for row in first)
    assert all(row["input"] == f"Question {row['instance_id'][1:]}?" and row["name"] == "coherence" for row in rows)
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["review"]["items"] == 10 and run["review"]["reasons"]["panel disagreement"] == 8
    assert run["review"]["reasons"]["at random"] == 2
    assert "<th>for review</th><td>10 item(s) in review.jsonl: 8 panel disagreement" in (tmp_path / "report.html").read_text()
