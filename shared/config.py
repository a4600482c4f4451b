"""Runtime settings, read from ``EVALQ_*`` environment variables.

One place for every knob so the CLI, the workers and the tests agree.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

CONTROL_QUEUE = "evalq.control"  # stage callbacks
JOBS_QUEUE = "evalq.jobs"  # job requests (evalq.submit_job): the orchestrator role


def _int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw else default


@dataclass(frozen=True)
class Settings:
    broker_url: str | None
    # Seconds a reserved-but-unacknowledged message stays invisible before Redis
    # redelivers it. Must exceed the longest task, or tasks run twice.
    visibility_timeout: int
    # Seconds job keys live in Redis after the outputs are written.
    result_ttl: int

    @classmethod
    def from_env(cls) -> "Settings":
        return cls(
            broker_url=os.environ.get("EVALQ_BROKER_URL") or None,
            visibility_timeout=_int("EVALQ_VISIBILITY_TIMEOUT", 3600),
            result_ttl=_int("EVALQ_RESULT_TTL", 7 * 24 * 3600),
        )
