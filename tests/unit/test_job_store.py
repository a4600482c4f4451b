"""The job store (evalq.shared.store): instances staged as Parquet parts and read back by
position, on a local folder; pyarrow reading the parts directly is the reference."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from evalq.shared.core.errors import InfraError
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
        assert staged.lines(None, "j", {"instances": spec}, lo, hi) == lines[lo:min(hi, 700)]
    positions = [698, 3, spec["starts"][3], 3, 701, -1, 350]
    assert staged.lines_at(None, "j", {"instances": spec}, positions) == \
        [lines[698], lines[3], lines[spec["starts"][3]], lines[3], None, None, lines[350]]


def test_an_empty_job_stages_no_part(tmp_path):
    spec = staged.stage(Place(str(tmp_path / "job")), iter([]))
    assert spec["n"] == 0 and spec["starts"] == [] and staged.lines(None, "j", {"instances": spec}, 0, 5) == []


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
    assert job_place(root, "abc", None).uri == f"{root.uri}/default/jobs/abc"
    assert job_place(root, "abc", "team-a").uri == f"{root.uri}/team-a/jobs/abc"
    s3 = store_root({"EVALQ_STORE": "s3://bucket/evalq/{tenant}/store", "EVALQ_STORE_ENDPOINT_URL": "http://x:9"})
    assert job_place(s3, "abc", "t1") == Place("s3://bucket/evalq/t1/store/jobs/abc", "http://x:9")


def test_a_worker_reads_a_part_once_for_consecutive_chunks(tmp_path, monkeypatch):
    lines = lines_of(400)
    spec = staged.stage(Place(str(tmp_path / "job")), iter(lines), part_bytes=10 ** 9)
    reads = []
    original = Place.get
    monkeypatch.setattr(Place, "get", lambda self, name: reads.append(name) or original(self, name))
    staged._PARTS.clear()
    for lo in range(0, 400, 50):  # eight chunks of one part
        assert staged.lines(None, "j", {"instances": spec}, lo, lo + 50) == lines[lo:lo + 50]
    assert reads == ["instances/part-00000.parquet"]
