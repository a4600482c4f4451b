"""The job store (evalq.shared.store): instances staged as Parquet parts and read back by
position, on a local folder; pyarrow reading the parts directly is the reference."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from evalq.shared.core.errors import InfraError
from evalq.shared.job.stored import StoredJob
from evalq.shared.store import instances as staged
from evalq.shared.store.place import Place, job_place, store_root


def lines_of(n: int) -> list[str]:
    # sizes that vary, so parts are cut by bytes at uneven positions
    return [json.dumps({"id": f"i{i}", "question": "q" * (i % 37), "context": ["c" * (i % 101)]}) for i in range(n)]


def test_staged_parts_hold_every_instance_once_in_order(tmp_path):
    lines = lines_of(1000)
    spec = staged.stage(Place(str(tmp_path / "job")), iter(lines), part_bytes=9000)
    parts = sorted((tmp_path / "job" / "instances").glob("part-*.parquet"))
    assert len(parts) == len(spec["starts"]) > 5  # cut by bytes, not one part
    read = [pq.read_table(p) for p in parts]
    assert [row for t in read for row in t.column("position").to_pylist()] == list(range(1000))
    assert [row for t in read for row in t.column("instance").to_pylist()] == lines
    assert spec["starts"] == [t.column("position")[0].as_py() for t in read]
    assert spec["n"] == 1000 and spec["format"] == "parquet"
    assert pq.ParquetFile(parts[0]).metadata.row_group(0).column(1).compression == "ZSTD"


def test_any_range_and_any_positions_read_back_across_parts(tmp_path):
    lines = lines_of(700)
    spec = staged.stage(Place(str(tmp_path / "job")), iter(lines), part_bytes=5000)
    for lo, hi in [(0, 700), (0, 1), (699, 700), (spec["starts"][2] - 3, spec["starts"][4] + 2), (650, 900)]:
        assert staged.instances_of(spec, "j").lines(None, lo, hi) == lines[lo:min(hi, 700)]
    positions = [698, 3, spec["starts"][3], 3, 701, -1, 350]
    assert staged.instances_of(spec, "j").lines_at(None, positions) == \
        [lines[698], lines[3], lines[spec["starts"][3]], lines[3], None, None, lines[350]]


def test_an_empty_job_stages_no_part(tmp_path):
    spec = staged.stage(Place(str(tmp_path / "job")), iter([]))
    assert spec["n"] == 0 and spec["starts"] == [] and staged.instances_of(spec, "j").lines(None, 0, 5) == []


def test_a_part_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    place = Place(str(tmp_path / "job"))
    place.put("a/b.bin", b"x" * 10)
    assert place.get("a/b.bin") == b"x" * 10
    assert [p.name for p in (tmp_path / "job" / "a").iterdir()] == ["b.bin"]  # no temporary file left
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(InfraError, match=r"file/x/y.bin: cannot write to the job store"):
        Place(str(tmp_path / "file" / "x")).put("y.bin", b"1")
    place.delete()
    assert not (tmp_path / "job").exists()
    place.delete()  # nothing there: no error


def test_the_store_is_the_operators_and_each_tenant_has_its_part(tmp_path):
    assert store_root({}) is None
    root = store_root({"EVALQ_STORE": str(tmp_path / "s"), "EVALQ_STORE_ENDPOINT_URL": ""})
    assert root == Place(str((tmp_path / "s").resolve()))
    assert job_place(root, "abc", None).uri == f"{root.uri}/default/suite=default/job=abc"
    assert job_place(root, "abc", "team-a", "rag/nightly:eu").uri == f"{root.uri}/team-a/suite=rag%2Fnightly%3Aeu/job=abc"
    s3 = store_root({"EVALQ_STORE": "s3://bucket/evalq/{tenant}/store", "EVALQ_STORE_ENDPOINT_URL": "http://x:9"})
    assert job_place(s3, "abc", "t1", "n") == Place("s3://bucket/evalq/t1/store/suite=n/job=abc", "http://x:9")


def test_a_worker_reads_a_part_once_for_consecutive_chunks(tmp_path, monkeypatch):
    lines = lines_of(400)
    spec = staged.stage(Place(str(tmp_path / "job")), iter(lines), part_bytes=10 ** 9)
    reads = []
    original = Place.get
    monkeypatch.setattr(Place, "get", lambda self, name: reads.append(name) or original(self, name))
    staged._PARTS.clear()
    for lo in range(0, 400, 50):  # eight chunks of one part
        assert staged.instances_of(spec, "j").lines(None, lo, lo + 50) == lines[lo:lo + 50]
    assert reads == ["instances/part-00000.parquet"]


def records_spec(tmp_path, chunk_size=4, parts=True) -> dict:
    spec = {"metrics": {"m@0": {"id": "exact_match", "chunk_size": chunk_size}}, "n_instances": 10}
    if parts:
        spec["instances"] = staged.stage(Place(str(tmp_path / "job")), iter(lines_of(10)))
        spec["records"] = "parts"
    return spec


def write_chunk(r, spec, job, start, records):
    pipe = r.pipeline(transaction=True)
    whole = sorted(records.items())
    StoredJob(spec, job).records.write(pipe, "m@0", start, records, whole)
    pipe.execute()


@pytest.mark.parametrize("parts", [True, False], ids=["parts", "redis"])
def test_records_are_counted_once_however_often_a_chunk_is_written(redis_url, tmp_path, parts):
    import redis

    from evalq.shared.cluster import keys
    from evalq.shared.store import records as stored

    r = redis.Redis.from_url(redis_url)
    job = f"rec{uuid.uuid4().hex[:8]}"
    spec = records_spec(tmp_path, parts=parts)
    made = {p: {"instance_id": f"i{p}", "result": p % 2, **({"category": "c"} if p % 3 else {})} for p in range(10)}
    try:
        write_chunk(r, spec, job, 4, {p: made[p] for p in range(4, 8)})
        write_chunk(r, spec, job, 0, {p: made[p] for p in range(0, 4)})
        write_chunk(r, spec, job, 4, {p: made[p] for p in range(4, 8)})  # redelivered: the same again
        write_chunk(r, spec, job, 8, {8: made[8]})  # position 9 had nothing to record
        assert stored.count(r, job, "m@0") == 9
        got = StoredJob(spec, job).records.get_many(r, "m@0", [9, 0, 5, 8, 3])
        assert [json.loads(g) if g is not None else None for g in got] == [None, made[0], made[5], made[8], made[3]]
        scanned = sorted((p, json.loads(raw)) for p, raw in StoredJob(spec, job).records.scan(r, "m@0"))
        assert scanned == [(p, made[p]) for p in range(9)]
        assert bool(r.exists(keys.results(job, "m@0"))) is not parts
        if parts:
            table = pq.read_table(tmp_path / "job" / "records" / "entry=m%400" / "chunk-000000004.parquet")
            assert table.column_names == ["position", "instance_id", "category", "outcome", "score", "label",
                                          "passed", "error", "record"]
            assert table.column("position").to_pylist() == [4, 5, 6, 7]
            assert table.column("category").to_pylist() == ["c", "c", None, "c"]
    finally:
        r.delete(*keys.all_job_keys(job, ["m@0"]))


def test_the_history_values_of_a_chunk_ride_in_its_part_not_in_redis(redis_url, tmp_path):
    import redis

    from evalq.results.recording import item_fields
    from evalq.shared.cluster import keys
    from evalq.shared.core.jsonio import pack_floats

    r = redis.Redis.from_url(redis_url)
    job = f"val{uuid.uuid4().hex[:8]}"
    spec = records_spec(tmp_path)
    try:
        for start in (8, 0, 4):  # in any order: the items come back in position order
            stop = min(start + 4, 10)
            pipe = r.pipeline(transaction=True)
            whole = [(p, {"instance_id": f"i{p}", "result": p / 10}) for p in range(start, stop)]
            values = {"ids": [f"i{p}" for p in range(start, stop)], "fields": {},
                      "fields_f64": {"mean": pack_floats([p / 10 for p in range(start, stop)])}}
            StoredJob(spec, job).records.write(pipe, "m@0", start, dict(whole), whole, values)
            pipe.execute()
        ids, got = item_fields(r, job, "m@0", "mean", {}, chunks=3, spec=spec)["mean"]
        assert ids == [f"i{p}" for p in range(10)] and got == [p / 10 for p in range(10)]
        assert not r.exists(keys.values(job, "m@0"))
        # a chunk whose part lacks them (an older evalq's): the items are read from the records instead
        pipe = r.pipeline(transaction=True)
        StoredJob(spec, job).records.write(pipe, "m@0", 4, {},
                                           [(p, {"instance_id": f"i{p}", "result": p / 10}) for p in range(4, 8)])
        pipe.execute()
        ids, got = item_fields(r, job, "m@0", "mean", {}, chunks=3, spec=spec)["mean"]
        assert ids == [f"i{p}" for p in range(10)] and got == [p / 10 for p in range(10)]
    finally:
        r.delete(*keys.all_job_keys(job, ["m@0"]))


def test_a_tenants_per_job_size_is_the_operators_setting():
    from evalq.shared.cluster.scheduling import Tenants
    from evalq.shared.core.errors import JobError
    from evalq.shared.data.instances import SpooledInstances
    from evalq.shared.store.instances import staged_bytes

    tenants = Tenants.parse("ads=1;ads.job_staged=2048;default.job_staged=1e6")
    assert tenants.policy(tenants.job_staged, "ads") == 2048 and tenants.policy(tenants.job_staged, "x") == 10**6
    assert "ads" in tenants.names
    with pytest.raises(JobError, match="job_staged must be a number > 0"):
        Tenants.parse("ads.job_staged=-1")
    spool, inline = SpooledInstances(), [{"id": str(i), "input": "é" * i} for i in range(20)]
    for inst in inline:
        spool.append(inst)
    # what a stored instance takes: its JSON line's bytes, as the spool holds it and as it is staged
    assert staged_bytes(inline) == staged_bytes(spool) == sum(len(line.encode()) + 1 for line in spool.json_lines())


@pytest.mark.parametrize("n, said", [(0, "0 bytes"), (1023, "1023 bytes"), (2048, "2 KiB"), (100_000, "97.7 KiB"),
                                     (3_205_136, "3.06 MiB"), (512 << 20, "512 MiB"), (1023 << 20, "1023 MiB"),
                                     (3 << 30, "3 GiB")])
def test_a_size_reads_as_a_person_says_it(n, said):
    """Issue 74: evalq gc said it freed "3.05666 MiB"."""
    from evalq.shared.core.limits import size

    assert size(n) == said
