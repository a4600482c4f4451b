"""What the broker holds of the cluster's work, read from Redis as kombu keeps it: each
queue's list of messages, and ``unacked`` (delivered, not yet acknowledged: reserved,
held for a countdown, or running). Every message is read for the job its arguments
name (honouring kombu's ``body_encoding``); one that cannot be read is skipped and
logged once, so no stuck or foreign message blinds the sweeper or the dispatcher."""

from __future__ import annotations

import base64
import json
import logging

import redis

log = logging.getLogger("evalq.sweeper")

# Tasks whose first argument is a job id: a job's own messages.
JOB_TASKS = frozenset({"evalq.score_chunk", "evalq.finalize", "evalq.generated"})
SCAN_PAGE = 1000
_unreadable_seen: set[str] = set()  # messages already logged as unreadable (logged once each)


class Unreadable(ValueError):
    """A message on a queue or in ``unacked`` that is not a readable kombu message."""


def message_job(raw: bytes) -> str | None:
    """The job id a kombu message on a queue list (or an ``unacked`` entry: ``[message,
    exchange, routing key]``) is for; None for any other task. Unreadable: not a message."""
    try:
        message = json.loads(raw)
        if isinstance(message, list):
            message = message[0]
        if isinstance(message, str):
            message = json.loads(message)
        headers = message.get("headers") or {}
        if headers.get("task") not in JOB_TASKS:
            return None
        body = message["body"]
        if (message.get("properties") or {}).get("body_encoding") == "base64":
            body = base64.b64decode(body, validate=True)
        args = json.loads(body)[0]  # task protocol 2: [args, kwargs, embed]
        job = args[0] if isinstance(args, list) and args else None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError) as exc:
        raise Unreadable(f"{type(exc).__name__}: {exc}") from None
    return job if isinstance(job, str) else None


def _skip_unreadable(raw: bytes, where: str, exc: Exception) -> None:
    tag = f"{where}:{hash(raw)}"
    if tag not in _unreadable_seen:
        if len(_unreadable_seen) > 10_000:
            _unreadable_seen.clear()
        _unreadable_seen.add(tag)
        log.warning("sweeper: skipping a message in %s that is not a readable task (%s)", where, exc)


def busy_jobs(r: redis.Redis, queues: set[str], candidates: set[str], unacked: bool = True) -> set[str]:
    """Which of ``candidates`` have a message of their own queued on ``queues`` or (``unacked``)
    delivered and not yet acknowledged. Each message is read (honouring kombu's ``body_encoding``) and
    counted for the job its arguments name, so one stuck or foreign message blinds no job, and
    another job's backlog on a shared queue does not hide a job whose own messages were lost."""
    found: set[str] = set()

    def look(raw: bytes, where: str) -> bool:
        try:
            job = message_job(raw)
        except Unreadable as exc:
            _skip_unreadable(raw, where, exc)
            return False
        if job in candidates:
            found.add(job)
        return found >= candidates

    for _, raw in r.hscan_iter("unacked", count=SCAN_PAGE) if unacked else ():  # kombu's delivered, unacked
        if look(raw, "unacked"):
            return found
    for queue in sorted(queues):
        start = 0
        while True:
            page = r.lrange(queue, start, start + SCAN_PAGE - 1)
            for raw in page:
                if look(raw, queue):
                    return found
            if len(page) < SCAN_PAGE:
                break
            start += SCAN_PAGE
    return found


def out_counts(r: redis.Redis, queues: set[str]) -> dict[str, int]:
    """Chunks out on each queue, as the broker holds them: waiting on its list, or delivered
    and not acknowledged (reserved, held for a countdown, running)."""
    counts = {q: r.llen(q) for q in queues}
    for _, raw in r.hscan_iter("unacked", count=SCAN_PAGE):
        try:
            routing_key = json.loads(raw)[2]
        except (ValueError, TypeError, IndexError, KeyError):
            continue
        if routing_key in counts:
            counts[routing_key] += 1
    return counts
