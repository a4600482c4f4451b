"""What the batch manager (``evalq.workers.judge.batches``) keeps in Redis, and how it is
read and changed: its timing settings, a job's batch records, and the two ways a line
leaves the batch path (its reply counted into the entry's accounting, or the line sent
synchronously, giving its holds of the job's caps back)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import redis

from evalq.shared.cluster import keys
from evalq.shared.core.config import env_number
from evalq.shared.job.stored import StoredJob, as_stored
from evalq.shared.judging.judges import Deployment, EndpointConfig
from evalq.workers.judge.client import accounting_ops
from evalq.workers.judge.cost import release_ops

MAX_TRIES = 2          # batches a line is sent in before it goes synchronously
UNFINISHED = ("creating", "validating", "in_progress", "finalizing", "cancelling")


@dataclass(frozen=True)
class BatchTiming:
    tick: float = 2.0         # seconds between ticks
    settle: float = 10.0      # seconds without a new line before a region's queue is sent
    poll_first: float = 5.0   # first poll of a batch after this; doubling up to poll_max
    poll_max: float = 300.0
    max_lines: int = 50_000   # lines per batch (OpenAI's limit)
    lock: float = 60.0        # seconds a region's lock outlives a manager that died holding it

    @classmethod
    def from_env(cls) -> "BatchTiming":
        return cls(tick=env_number("EVALQ_BATCH_TICK", 2.0),
                   settle=env_number("EVALQ_BATCH_SETTLE", 10.0),
                   poll_first=env_number("EVALQ_BATCH_POLL", 5.0),
                   poll_max=env_number("EVALQ_BATCH_POLL_MAX", 300.0),
                   max_lines=int(env_number("EVALQ_BATCH_MAX_LINES", 50_000)),
                   lock=env_number("EVALQ_BATCH_LOCK", 60.0))


def deployment_in(config: EndpointConfig, region: str) -> Deployment:
    return next(d for d in config.deployments if d.region == region)


def records(r: redis.Redis, job_id: str) -> dict[str, dict]:
    """The job's batches (``evalq:{J}:batch:open``): id -> record."""
    return {k.decode(): json.loads(v) for k, v in r.hgetall(keys.batch(job_id, "open")).items()}


def count(pipe, job_id: str, entry: str, region: str, fields: dict[str, int]) -> None:
    """Add ``fields`` to the entry's accounting in ``pipe``, as the judge client counts a call."""
    for method, args in accounting_ops(job_id, entry, region, fields):
        getattr(pipe, method)(*args)


def spend_keys(job_id: str, spec: StoredJob | dict) -> dict[str, list[str]]:
    """The counters a batch line's holds are on (``evalq.workers.judge.cost``): the job's caps and
    its tenant's daily limits, as the judge client that registered the line held them."""
    from evalq.workers.judge.cost import counters

    job = as_stored(spec, job_id)
    options, tenant = job.judging, job.tenant
    return {kind: [c.key for c in counters(job_id, tenant, kind, cap)]
            for kind, cap in (("cost", options.cost_cap), ("tokens", options.token_cap))}


def to_sync(pipe, job_id: str, digest: str, line: dict, why: str, spent: dict[str, list[str]], ttl: int) -> None:
    """The line is sent synchronously by its chunk; its holds of the caps (on ``spent``, the job's
    ``spend_keys``) go back. ``ttl``: the job's retention."""
    pipe.hset(keys.batch(job_id, "sync"), digest, why)
    pipe.expire(keys.batch(job_id, "sync"), ttl)
    pipe.hdel(keys.batch(job_id, "line"), digest)
    if line.get("h"):
        release_ops(pipe, spent["cost"], line["h"])
    for key in spent["tokens"] if line.get("k") else ():
        pipe.decrby(key, line["k"])
