"""Untrusted input within bounds: oversized files and lines, deep nesting, bytes
that are not UTF-8 and compression bombs end with a located error (exit 2, no
traceback), never a memory blow-up."""

from __future__ import annotations

import gzip
import json

import pytest

from tests.conftest import evalq

pytestmark = pytest.mark.integration


def dataset_job(tmp_path, data_name: str, skip: bool = False) -> str:
    job = {"dataset": {"uri": data_name, "format": "jsonl", "on_bad_record": "skip" if skip else "fail"},
           "metrics": [{"id": "exact_match"}]}
    (tmp_path / "job.json").write_text(json.dumps(job))
    return str(tmp_path / "job.json")


def good(i: int) -> bytes:
    return json.dumps({"id": f"r{i}", "actual-output": "a", "expected-output": ["a"]}).encode() + b"\n"


def validate(path: str, **env) -> tuple[int, str, str]:
    proc = evalq("validate", path, env={k: str(v) for k, v in env.items()}, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stdout, proc.stderr


def test_a_job_file_nested_without_end_is_exit_2(tmp_path):
    path = tmp_path / "job.json"
    path.write_text('{"instances": [{"id": "a", "actual-output": "x", "context": ' + "[" * 100_000 + "]" * 100_000
                    + '}], "metrics": [{"id": "exact_match"}]}')
    code, _, err = validate(str(path))
    assert code == 2 and f"{path}: JSON nested deeper than 64 levels (EVALQ_MAX_JSON_DEPTH)" in err
    path.write_text(json.dumps({"instances": [{"id": "a", "actual-output": "x", "expected-output": ["x"],
                                               "context": [[[[["deep"]]]]]}], "metrics": [{"id": "exact_match"}]}))
    assert validate(str(path), EVALQ_MAX_JSON_DEPTH=4)[0] == 2
    assert validate(str(path), EVALQ_MAX_JSON_DEPTH=10)[0] == 0


def test_a_job_file_over_the_size_limit_is_exit_2(tmp_path):
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"instances": [{"id": f"i{i}", "actual-output": "x" * 100, "expected-output": ["x"]}
                                              for i in range(50)], "metrics": [{"id": "exact_match"}]}))
    code, _, err = validate(str(path), EVALQ_MAX_JOB_BYTES=1000)
    assert code == 2 and "larger than 1000 bytes (EVALQ_MAX_JOB_BYTES)" in err


def test_long_lines_bad_bytes_and_deep_records_are_bad_records(tmp_path):
    (tmp_path / "d.jsonl").write_bytes(good(1) + b'{"id": "long", "actual-output": "' + b"y" * 5000 + b'"}\n'
                                       + b'{"id": "bin", "actual-output": "\xff\xfe"}\n'
                                       + b'{"id": "deep", "x": ' + b"[" * 200 + b"]" * 200 + b"}\n" + good(5))
    path = dataset_job(tmp_path, "d.jsonl")
    code, _, err = validate(path, EVALQ_MAX_RECORD_BYTES=1000)
    assert code == 2
    assert "d.jsonl line 2: line longer than 1000 bytes (EVALQ_MAX_RECORD_BYTES)" in err
    assert "d.jsonl line 3: not UTF-8 (invalid start byte at byte 32)" in err
    assert "d.jsonl line 4: JSON nested deeper than 64 levels" in err
    code, out, _ = validate(dataset_job(tmp_path, "d.jsonl", skip=True), EVALQ_MAX_RECORD_BYTES=1000)
    assert code == 0 and "skipped 3 bad record(s)" in out and "valid: 2 instances" in out


def test_gzip_bombs_stop_at_the_limits(tmp_path):
    # one line inflating to 64 MiB: read past in pieces, reported as one bad record
    (tmp_path / "line.jsonl.gz").write_bytes(gzip.compress(good(1) + b"[" + b"0," * (32 << 20) + b"0]\n" + good(2)))
    code, out, err = validate(dataset_job(tmp_path, "line.jsonl.gz", skip=True))
    assert code == 0 and "skipped 1 bad record(s)" in out and "line longer than 16 MiB" in out
    # many small lines inflating beyond the dataset limit: reading stops, exit 2
    (tmp_path / "many.jsonl.gz").write_bytes(gzip.compress(b"".join(good(i) for i in range(60_000))))
    code, _, err = validate(dataset_job(tmp_path, "many.jsonl.gz"), EVALQ_MAX_DATASET_BYTES=1 << 20)
    assert code == 2 and "stopped reading: the dataset is larger than 1 MiB once decompressed" in err
