"""Test-only: makes the final callback's writing slow, for the tests of a callback that runs
longer than ``EVALQ_CALLBACK_GRACE`` (a big job's, which takes minutes at a million items).

Loaded through EVALQ_PLUGINS by the worker a test starts. It wraps the real
``write_outputs``: every output is still written by evalq's own code, after
``SLOW_CALLBACK_SECONDS``. Each write is noted in Redis (``SLOW_CALLBACK_KEY``: a list of
``start:<t>``/``end:<t>`` entries), so a test sees how many ran and whether two overlapped."""

from __future__ import annotations

import os
import time

from evalq.results import outputs

_write = outputs.write_outputs


def slow_write(r, spec, job_id, summary, run, dest, *rest) -> None:
    key = os.environ.get("SLOW_CALLBACK_KEY", "test:slow-callback")
    r.rpush(key, f"start:{os.getpid()}:{time.time()}")
    time.sleep(float(os.environ.get("SLOW_CALLBACK_SECONDS", "5")))
    _write(r, spec, job_id, summary, run, dest, *rest)
    r.rpush(key, f"end:{os.getpid()}:{time.time()}")


outputs.write_outputs = slow_write
