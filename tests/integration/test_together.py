"""Entries scored together (``evalq.orchestrator.submit.group_entries``): a job's cpu entries over
the same instances go out as one chunk per instance range, read and decoded once, and every
entry still gets exactly what it gets when its chunks run alone: the same log lines, the same
results, item errors where they were, and an agent run's calls parsed once for both agent
metrics (compared with the metric functions called directly). Real Redis, real workers."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import redis

from evalq.cli.run import run_job
from evalq.shared.cluster import keys
from evalq.shared.job.schema import parse_job
from tests.conftest import read_log

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

WORDS = "the a cat dog sat ran on under mat rug quickly slowly red blue".split()


def _text_job(n: int) -> dict:
    rng = random.Random(7)
    instances = []
    for i in range(n):
        ref = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9)))
        out = ref if rng.random() < 0.3 else " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 9)))
        if i % 11 == 0:
            out += " FAIL"  # fail_on (a test plugin) raises on this item: an item error, not the chunk's
        instances.append({"id": f"t{i}", "actual-output": out, "expected-output": [ref, ref.upper()]})
    return {"instances": instances, "metrics": [
        {"id": "bleu"}, {"id": "rouge"}, {"id": "exact_match"}, {"id": "f1_score"}, {"id": "fail_on"},
        {"id": "bleu", "name": "bleu_bigram", "parameters": {"weights": [0.5, 0.5]}}]}


def _agent_job() -> dict:
    """The example agent runs (OpenAI chat logs), by trajectory twice and tool_call_f1."""
    job = json.loads((ROOT / "examples" / "agent_trajectories.json").read_text())
    job["dataset"]["uri"] = str(ROOT / "examples" / job["dataset"]["uri"])
    return job


def _run(raw: dict, out, url: str, monkeypatch, together: bool, chunk_size: int) -> tuple[dict, list, dict]:
    monkeypatch.setenv("EVALQ_GROUP_ENTRIES", "1" if together else "0")
    summary = run_job(parse_job(raw), out, broker=url, chunk_size=chunk_size, progress=False, stall_timeout=120)
    run = json.loads((out / "run.json").read_text())
    r = redis.Redis.from_url(url)
    spec = json.loads(r.get(keys.spec(run["job_id"])))
    lines = sorted(json.dumps(line, sort_keys=True) for line in read_log(out))
    return spec, lines, {json.dumps(e.get("name") or e["metric"]): _scores(e) for e in summary}


def _scores(entry: dict) -> dict:
    return {k: v for k, v in entry.items() if k not in ("elapsed_time", "compute_time", "regressions")}


@pytest.mark.parametrize("make,chunk_size", [(_text_job, 7), (_agent_job, 2)], ids=["text", "agent"])
def test_entries_scored_together_record_what_they_record_alone(redis_url, cpu_worker, tmp_path, monkeypatch,
                                                               make, chunk_size):
    raw = make(40) if make is _text_job else make()
    spec, together, summary = _run(raw, tmp_path / "together", redis_url, monkeypatch, True, chunk_size)
    keys_ = list(spec["metrics"])
    leader = spec["metrics"][keys_[0]]
    assert leader["companions"] == keys_[1:] and all(spec["metrics"][k]["led_by"] == keys_[0] for k in keys_[1:])
    alone_spec, alone, alone_summary = _run(raw, tmp_path / "alone", redis_url, monkeypatch, False, chunk_size)
    assert not any("companions" in e or "led_by" in e for e in alone_spec["metrics"].values())
    assert together == alone
    assert summary == alone_summary
    n = len(parse_job(raw).instances)
    assert len(together) == n * len(keys_)
    if make is _text_job:  # the failing items failed in both, and only they
        failed = {json.loads(line)["instance_id"] for line in together if "error" in json.loads(line)}
        assert failed == {f"t{i}" for i in range(0, n, 11)}


def test_agent_metrics_scored_together_equal_the_functions_called_directly(redis_url, cpu_worker, tmp_path,
                                                                             monkeypatch):
    """The calls of a run, parsed once for the three entries, give each what parsing its own gives."""
    from evalq.shared.agents.params import ToolCallF1Params, TrajectoryParams
    from evalq.workers.agents.trajectory import tool_call_f1, trajectory

    raw = _agent_job()
    job = parse_job(raw)
    _run(raw, tmp_path / "out", redis_url, monkeypatch, True, 3)
    got = {(line["instance_id"], line["entry"]): line["result"] for line in read_log(tmp_path / "out")}
    assert len(got) == 3 * len(job.instances)
    unordered = TrajectoryParams(argument_match="subset", strict_order=False)
    for inst in job.instances:
        assert got[(inst["id"], 0)] == json.loads(json.dumps(trajectory(inst, TrajectoryParams())))
        assert got[(inst["id"], 1)] == tool_call_f1(inst, ToolCallF1Params())
        assert got[(inst["id"], 2)] == json.loads(json.dumps(trajectory(inst, unordered)))
