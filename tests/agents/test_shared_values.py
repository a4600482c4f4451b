"""Tool definitions that every run of an agent dataset repeats are stored once per job: each
stored instance refers to that one copy, and workers and the report read the instances whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from evalq.orchestrator import submit
from evalq.shared.cluster import keys
from evalq.shared.data.instances import SHARED, SpooledInstances, json_lines
from evalq.shared.job.schema import load_job
from evalq.shared.job.stored import StoredJob
from evalq.shared.store import instances as stored_instances
from evalq.shared.store.place import Place
from tests.agents.test_agent_runs import chat_log
from tests.agents.test_trajectory import CASES, TOOLS


def test_a_spool_keeps_one_copy_and_gives_the_instances_back_whole():
    spool = SpooledInstances()
    other = [{"name": "lookup", "parameters": {"type": "object"}}]
    originals = [{"id": str(n), "tool_definitions": TOOLS if n % 3 else other, "messages": []} for n in range(9)]
    for inst in originals:
        spool.append(inst)
    assert len(spool.shared) == 2
    assert all(json.loads(line)["tool_definitions"].keys() == {SHARED} for line in spool.json_lines())
    assert list(spool) == originals
    shared: dict = {}  # inline instances are shared the same way as they are stored
    assert all(SHARED in json.loads(line)["tool_definitions"] for line in json_lines(originals, shared))
    assert sorted(shared.values()) == sorted(spool.shared.values())


@pytest.mark.parametrize("staged", [False, True], ids=["redis", "job-store"])
def test_a_stored_agent_dataset_holds_its_tools_once(redis_url, tmp_path, staged):
    data = tmp_path / "agent.jsonl"
    data.write_text("".join(json.dumps(chat_log(n, i)) + "\n" for n, i in CASES.items()))
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps({"dataset": {"uri": str(data)}, "metrics": [{"id": "trajectory"}]}))
    job = load_job(job_file)
    r = redis.Redis.from_url(redis_url)
    spec = submit.job_spec(job)
    job_id = submit.store_job(r, job, spec, store=Place(str(tmp_path / "store")) if staged else None)
    try:
        assert bool(r.exists(keys.instances(job_id))) is not staged
        kept = StoredJob(spec, job_id).instances
        stored = [json.loads(raw) for raw in kept.lines(r, 0, len(CASES) + 5)]
        # issue 70: a job staged in the store keeps its shared values there too, none in Redis
        assert r.hlen(keys.shared_values(job_id)) == (0 if staged else 1) and len(stored) == len(CASES)
        assert all('"parameters"' not in json.dumps(inst) for inst in stored)
        whole = kept.with_shared(r, stored)
        assert [inst["tool_definitions"] for inst in whole] == [TOOLS] * len(CASES)
        if staged:
            assert spec["instances"]["shared"] and (Path(spec["instances"]["uri"]) / stored_instances.SHARED_PART).exists()
        else:
            assert r.ttl(keys.shared_values(job_id)) > 0  # it goes when the job's keys go
    finally:
        submit.delete_job(r, job_id, [m.key for m in job.runs])
    assert not r.exists(keys.shared_values(job_id))


def test_what_a_job_shares_counts_against_what_it_may_stage():
    """Issue 70, item 4: tool definitions were counted as the references each instance holds (a few
    dozen bytes), so a job of megabytes of tools passed a tenant's job_staged limit."""
    tools = [{"name": f"tool{k}", "description": "x" * 10_000, "parameters": {"type": "object"}} for k in range(50)]
    instances = [{"id": str(n), "tool_definitions": tools, "messages": []} for n in range(3)]
    lines = sum(len(line.encode()) + 1 for line in json_lines(instances, {}))
    assert lines < 1_000 < 500_000 < stored_instances.staged_bytes(instances)
    spool = SpooledInstances()
    for inst in instances:
        spool.append(inst)
    assert stored_instances.staged_bytes(spool) == stored_instances.staged_bytes(instances)
