"""A client waiting for a job learns of its end when the final callback sets it, not at its
next look: the callback pushes the status onto the job's ``ended`` list, which the waiting
client blocks on between looks (real worker, real Redis)."""

from __future__ import annotations

import time

import pytest

from evalq.shared.cluster import keys

pytestmark = pytest.mark.integration


def test_the_end_wakes_a_waiting_client_at_once(redis_url, cpu_worker, tmp_path):
    from evalq.cli import wait as waiting
    from evalq.orchestrator import submit
    from evalq.shared.job.schema import parse_job

    job = parse_job({"instances": [{"id": str(i), "actual-output": "a", "expected-output": ["a"]}
                                   for i in range(20)], "metrics": [{"id": "exact_match"}]}, source="t")
    r = waiting.connect(redis_url)
    job_id = submit.submit(r, redis_url, job, out=str(tmp_path / "out"))
    t0 = time.monotonic()
    # looks 30 s apart: a client woken only by its next look would wait ~30 s for this short job
    status = waiting.wait(r, redis_url, job_id, on_progress=lambda n: None, check=lambda: None, poll=30)
    elapsed = time.monotonic() - t0
    assert status == "done"
    assert elapsed < 20, f"the client slept through the end ({elapsed:.1f} s)"
    # the word stays for another waiter, and goes with the job's keys
    assert r.lrange(keys.ended(job_id), 0, -1) == [b"done"]
    assert r.ttl(keys.ended(job_id)) > 0
    r2 = waiting.connect(redis_url)
    t0 = time.monotonic()
    assert waiting.wait(r2, redis_url, job_id, on_progress=lambda n: None, check=lambda: None, poll=30) == "done"
    assert time.monotonic() - t0 < 5
