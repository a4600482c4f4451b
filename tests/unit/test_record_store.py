"""A job's item records through one interface whichever backend keeps them (issue 71): a Redis hash or a
Parquet part per chunk in the job store, chosen once by the stored job (``StoredJob.records``)."""

from __future__ import annotations

import json
import uuid

import pytest
import redis

from evalq.shared.cluster import keys
from evalq.shared.job.stored import StoredJob
from evalq.shared.store.records import PartRecords, RedisRecords
from tests.unit.test_job_store import records_spec


@pytest.fixture
def r(redis_url):
    return redis.Redis.from_url(redis_url)


@pytest.mark.parametrize("parts", [True, False], ids=["parts", "redis"])
def test_every_reader_gets_the_same_from_either_backend(r, tmp_path, parts):
    job = f"rs{uuid.uuid4().hex[:8]}"
    records = StoredJob(records_spec(tmp_path, parts=parts), job).records
    assert isinstance(records, PartRecords if parts else RedisRecords)
    try:
        for start in (8, 0, 4):  # in any order
            whole = [(p, {"instance_id": f"i{p}", "result": p}) for p in range(start, min(start + 4, 10))]
            pipe = r.pipeline(transaction=True)
            records.write(pipe, "m@0", start, dict(whole), whole, values={"from": start}, view={"seen": start})
            pipe.execute()
        assert [json.loads(v) for v in records.views(r, "m@0")] == [{"seen": s} for s in (0, 4, 8)]
        assert [(s, json.loads(v)) for s, v in records.values(r, "m@0")] == [(s, {"from": s}) for s in (0, 4, 8)]
        assert sorted(p for p, _ in records.scan(r, "m@0")) == list(range(10))
        r.hset(keys.kept(job, "m@0"), "3", "kept")
        recorded, kept = records.get_many_beside(r, "m@0", [3, 9], keys.kept(job, "m@0"))
        assert [json.loads(x)["result"] for x in recorded] == [3, 9] and kept == [b"kept", None]
        assert records.read_step("m@0", 2000) == (4 if parts else 2000)  # a part at a time
        # what Redis keeps of a job does not grow with its items where they are parts
        assert bool(r.exists(keys.views(job, "m@0"))) is not parts
        assert bool(r.exists(keys.results(job, "m@0"))) is not parts
    finally:
        r.delete(*keys.all_job_keys(job, ["m@0"]), keys.kept(job, "m@0"))


def test_a_chunk_that_has_not_ended_leaves_its_view_in_redis_and_counts_nothing(r, tmp_path):
    job = f"rs{uuid.uuid4().hex[:8]}"
    records = StoredJob(records_spec(tmp_path), job).records
    try:
        pipe = r.pipeline(transaction=True)
        records.write(pipe, "m@0", 0, {0: {"instance_id": "i0", "result": 1}}, None, view={"seen": 0})
        pipe.execute()
        assert not (tmp_path / "job" / "records").exists()
        assert r.hget(keys.views(job, "m@0"), "0") is not None
        assert not r.exists(keys.recorded_total(job, "m@0"))
    finally:
        r.delete(*keys.all_job_keys(job, ["m@0"]))
