"""A job's status, as stored in Redis (``evalq:{job}:status``) and shown by ``evalq status``."""

from __future__ import annotations

from enum import Enum


class Status(str, Enum):
    RUNNING = "running"      # submitted; its stages are running
    GENERATED = "generated"  # the model under test answered; the metrics stage is running
    DONE = "done"
    FAILED = "failed"        # its outputs could not be made (the reason is stored beside it)
    CANCELLED = "cancelled"  # partial outputs were written
    INVALID = "invalid"      # a request whose job did not validate: nothing ran

    def __str__(self) -> str:
        return self.value


# A job in one of these has ended: nothing more runs, its keys expire after EVALQ_RESULT_TTL.
FINAL = frozenset({Status.DONE, Status.FAILED, Status.CANCELLED, Status.INVALID})


def status_of(r, job_id: str) -> str:
    """A job's status as stored (``""`` once its keys are gone)."""
    from evalq.shared.cluster import keys

    return (r.get(keys.status(job_id)) or b"").decode()
