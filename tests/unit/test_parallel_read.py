"""A large local JSON Lines dataset read by several processes gives exactly what one process
gives: the instances and their lines, the problems in line order up to the same stop, the bad
records, the checker's counts, the id hashes of the duplicate check, the shared tool definitions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evalq.shared.data import parallel_read
from evalq.shared.data.dataset import DataConfig, DatasetSpec, RecordMapper
from evalq.shared.data.instances import MAX_BAD_SHOWN, InstanceChecker, load_dataset

ROOT = Path(__file__).resolve().parents[2]
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]


def lines(n_bad_every: int) -> list[bytes]:
    out = []
    for i in range(400):
        rec = {"id": f"r{i % 390}", "messages": [{"role": "user", "content": f"q{i}"},
                                                   {"role": "assistant", "content": f"a{i}"}],
               "tools": TOOLS if i % 2 else TOOLS[:0] or TOOLS, "category": f"c{i % 3}"}
        if i % 50 == 7:
            del rec["id"]  # its id is its line number
        text = json.dumps(rec).encode()
        if n_bad_every and i % n_bad_every == n_bad_every // 2:
            text = [b'{"broken', b"\xff\xfe not utf-8", b"[" * 40 + b"]" * 40, b"x" * 3000,
                    json.dumps({"id": f"m{i}", "messages": [{"role": "robot"}]}).encode()][i % 5]
        out.append(text + b"\n")
        if i % 37 == 0:
            out.append(b"\n")  # blank lines are skipped, and still counted
    return out


def read(path, processes: int, on_bad: str, max_problems: int = 1000):
    parallel_read.READ_PROCESSES = processes
    parallel_read.MIN_BYTES = 2000
    spec = DatasetSpec(uri=str(path), on_bad_record=on_bad)
    assert parallel_read.processes_for(spec) == (processes if processes > 1 else 1)
    checker = InstanceChecker({"actual-output": ["m"]}, generating=False)
    problems = []
    loaded = load_dataset(spec, checker, lambda where, p: problems.append((where, p)), max_problems)
    return (list(loaded.instances), loaded.lines.tolist(), loaded.bad.count, loaded.bad.shown, problems,
            loaded.mapping, checker.n_to_generate, sorted(checker.categories), checker.hashes().tolist(),
            sorted(loaded.instances.shared.values()))


def both(path: str, on_bad: str, max_problems: int) -> dict:
    """Run in a process of its own (python -m this module): the several-process path forks, which
    evalq does only in a single-threaded process, and a test runner has threads."""
    one, several = read(path, 1, on_bad, max_problems), read(path, 3, on_bad, max_problems)
    return {"one": one, "several": several}


@pytest.mark.parametrize("on_bad, bad_every, max_problems", [
    ("fail", 0, 1000), ("fail", 6, 1000), ("fail", 6, 25), ("skip", 6, 1000), ("skip", 3, 1000)])
def test_several_processes_read_what_one_reads(tmp_path, on_bad, bad_every, max_problems):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"".join(lines(bad_every)))
    proc = subprocess.run([sys.executable, "-m", "tests.unit.test_parallel_read", str(path), on_bad, str(max_problems)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "EVALQ_MAX_RECORD_BYTES": "2048", "EVALQ_MAX_JSON_DEPTH": "32"})
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    one, several = got["one"], got["several"]
    if max_problems == 25:  # a dataset that fails past what is shown: the same problems, the same stop
        assert several[4] == one[4]  # (the instances read before the stop are never used)
    else:
        assert several == one
    instances, _, n_bad, shown, problems = one[:5]
    assert instances and (problems or n_bad or not bad_every)
    if bad_every and on_bad == "fail":
        assert any("line longer than" in p for _, p in problems) and any("not UTF-8" in p for _, p in problems)
    if max_problems == 25:
        assert problems[-1][1].startswith("stopped reading here") and len(problems) == 25
    if on_bad == "skip":
        assert len(shown) == min(n_bad, MAX_BAD_SHOWN)


def test_a_process_that_reads_two_parts_counts_each_apart(tmp_path):
    """A pool process may be handed a second part: its counts (instances to generate, categories,
    the id hashes of the duplicate check) are that part's alone, not the sum of both."""
    from evalq.shared.data import instances

    path = tmp_path / "d.jsonl"
    path.write_bytes(b"".join(lines(0)))
    spec = DatasetSpec(uri=str(path))
    checker = InstanceChecker({"actual-output": ["m"]}, generating=False)
    mapper = RecordMapper(DataConfig(preset="openai_chat"))
    parts = parallel_read.ranges(path, 2)
    parallel_read._job.update(path=path, spec=spec, checker=checker, mapper=mapper,
                              limits=parallel_read.Limits.from_env(), keep_rejected=10,
                              examine=instances.examine, parsed=instances.parsed, share=instances.share)
    try:
        read = [parallel_read._read((a, b, 0, str(tmp_path / f"{k}.jsonl"))) for k, (a, b) in enumerate(parts)]
    finally:
        parallel_read._job.clear()
    assert [len(p.hashes) for p in read] == [p.n_kept for p in read] and sum(p.n_kept for p in read) == 400
    assert checker.hashes().tolist() == []  # the parent's checker is merged into, never counted in


def test_a_process_with_threads_reads_with_one(tmp_path, monkeypatch):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"".join(lines(0)))
    monkeypatch.setattr(parallel_read, "READ_PROCESSES", 4)
    monkeypatch.setattr(parallel_read, "MIN_BYTES", 2000)
    import threading

    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert parallel_read.processes_for(DatasetSpec(uri=str(path))) == 1
    finally:
        stop.set()
        other.join()


def test_ranges_start_at_line_starts(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"a\n" + b"x" * 5000 + b"\nb\nc\n")
    parts = parallel_read.ranges(path, 4)
    data = path.read_bytes()
    assert parts[0][0] == 0 and parts[-1][1] == len(data)
    assert all(a == 0 or data[a - 1:a] == b"\n" for a, _ in parts)
    assert all(b == c for (_, b), (c, _) in zip(parts, parts[1:]))


if __name__ == "__main__":
    print(json.dumps(both(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
