"""A gpu worker started with EVALQ_PRELOAD loads the model before any chunk arrives (a real
worker process, a real Redis), and a bad setting stops `evalq worker` at once."""

from __future__ import annotations

import time
import uuid

import pytest

from tests.conftest import evalq, read_results, start_worker, stop_worker, wait_for_worker, write_job

pytestmark = pytest.mark.integration

INSTANCES = [{"id": str(i), "actual-output": f"the cat sat on mat number {i}",
              "expected-output": [f"a cat was sitting on the mat {i}"]} for i in range(6)]


def _wait_for(path, text: str, timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = path.read_text(errors="replace")
        if text in log:
            return log
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not in the worker's log within {timeout} s:\n{path.read_text()[-3000:]}")


def test_the_model_is_loaded_before_the_first_chunk_and_only_once(private_redis, tmp_path):
    name = f"gpu{uuid.uuid4().hex[:6]}"
    proc = start_worker(private_redis, "gpu", tmp_path, concurrency=1, name=name,
                        env={"EVALQ_PRELOAD": '[{"id": "bertscore", "parameters": {"batch_size": 4}}]'})
    try:
        wait_for_worker(private_redis, name)
        log = _wait_for(proc.log_path, "preloaded bertscore: sentence-transformers/all-MiniLM-L6-v2 (layer 6) on cpu")
        assert "Task evalq.score_chunk" not in log  # nothing was sent yet: the worker loaded it on its own
        job = write_job(tmp_path / "job.json", INSTANCES,
                        [{"id": "bertscore", "parameters": {"batch_size": 2}}])
        done = evalq("run", str(job), "--out", str(tmp_path / "out"), "--broker", private_redis, "-q")
        assert done.returncode == 0, done.stderr
        results = read_results(tmp_path / "out")["bertscore"]
        assert results["n"] == len(INSTANCES) and results["n_errors"] == 0
        log = proc.log_path.read_text(errors="replace")
        assert "Task evalq.score_chunk" in log and log.count(" loaded ") == 1, log[-3000:]
    finally:
        stop_worker(proc)


def test_a_bad_setting_stops_the_worker_with_exit_2(tmp_path):
    done = evalq("worker", "--queues", "gpu", "--broker", "redis://127.0.0.1:1/0",
                 env={"EVALQ_PRELOAD": '[{"id": "bertscor"}, {"id": "bertscore", "parameters": {"batch_sise": 1}}]'},
                 timeout=60)
    assert done.returncode == 2, done.stderr
    assert "EVALQ_PRELOAD[0]: unknown metric 'bertscor'" in done.stderr
    assert "EVALQ_PRELOAD[1].parameters: unknown parameter 'batch_sise'" in done.stderr
    assert "Traceback" not in done.stderr
