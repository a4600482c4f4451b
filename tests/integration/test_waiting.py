"""A client waiting for a job learns of its end when the final callback sets it, not at its
next look: the callback pushes the status onto the job's ``ended`` list, which the waiting
client blocks on between looks (real worker, real Redis)."""

from __future__ import annotations

import time

import pytest
import redis

from evalq.shared.cluster import keys

pytestmark = pytest.mark.integration


def watch_for_the_end(r, job_id: str):
    """When the job's status became final, seen by a thread that looks every 20 ms (not through
    the mechanism under test): a function that returns it (time.monotonic()) once the thread saw it."""
    import threading

    box: dict = {}

    def look() -> None:
        while r.get(keys.status(job_id)) not in (b"done", b"failed", b"cancelled"):
            time.sleep(0.02)
        box["at"] = time.monotonic()

    thread = threading.Thread(target=look, daemon=True)
    thread.start()

    def ended_at() -> float:
        thread.join(120)  # a loaded machine may run the thread's next look after the client returned
        return box["at"]

    return ended_at


def test_the_end_wakes_a_waiting_client_at_once(redis_url, cpu_worker, tmp_path):
    from evalq.cli import wait as waiting
    from evalq.orchestrator import submit
    from evalq.shared.job.schema import parse_job

    job = parse_job({"instances": [{"id": str(i), "actual-output": "a", "expected-output": ["a"]}
                                   for i in range(20)], "metrics": [{"id": "exact_match"}]}, source="t")
    r = waiting.connect(redis_url)
    job_id = submit.submit(r, redis_url, job, out=str(tmp_path / "out"))
    end = watch_for_the_end(redis.Redis.from_url(redis_url), job_id)
    # looks 50 s apart: a client woken only by its next look would return up to 50 s after the end
    # (measured from the end, not from the start: however long the job takes on a loaded machine)
    status = waiting.wait(r, redis_url, job_id, on_progress=lambda n: None, check=lambda: None, poll=50)
    returned = time.monotonic()
    assert status == "done"
    late = returned - end()
    assert late < 20, f"the client slept through the end ({late:.1f} s after it)"
    # the word stays for another waiter, and goes with the job's keys
    assert r.lrange(keys.ended(job_id), 0, -1) == [b"done"]
    assert r.ttl(keys.ended(job_id)) > 0
    r2 = waiting.connect(redis_url)
    t0 = time.monotonic()
    assert waiting.wait(r2, redis_url, job_id, on_progress=lambda n: None, check=lambda: None, poll=50) == "done"
    assert time.monotonic() - t0 < 20  # its first look: not its next one, 50 s on
