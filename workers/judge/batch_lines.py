"""A judge client's side of the Batch API path (issue #24): a call that is not answered
yet becomes a line waiting for a provider batch, and the item waits for it.

In ``batch`` (and, until its deadline, ``auto``) mode, ``JudgeClient.complete`` asks
``BatchLines`` before it pays for anything:

- ``reply``: the job's memo (``evalq:{J}:memo``) holds the reply a batch brought back
  (the batch manager writes it there, exactly as a synchronous reply is kept);
- ``sync_reason``: the line is to be sent synchronously instead (it failed in two
  batches, ``auto`` passed its deadline, it can never fit the deployment's quota);
- otherwise ``register`` puts the line once per job (an identical request of
  another item or entry joins it) and the client raises ``Pending``: the item is scored again
  when the chunk is woken (``evalq.orchestrator.parking``).

A line holds the job's caps as a synchronous call would (the token cap with its
admission tokens, the cost cap with its worst case at the batch price); the batch
manager settles the hold when the reply comes, or gives it back when the line goes
synchronous. Redis only: the provider is the manager's business
(``evalq.workers.judge.batches``).
"""

from __future__ import annotations

import json
import time

import redis

from evalq.shared.cluster import keys
from evalq.shared.job.stored import default_retention
from evalq.shared.judging.judges import Deployment, EndpointConfig
from evalq.workers.judge.batch_api import estimate_tokens

# KEYS: line hash, queue of the region, touched hash, memo, sync; ARGV: digest, line, region, now,
# ttl. 1 when the line is new (queued now), 0 when it waits already, -1 when it was answered (or
# sent synchronously) since the caller looked: a call is never put in a second batch.
_REGISTER = """
if redis.call('HEXISTS', KEYS[4], ARGV[1]) == 1 or redis.call('HEXISTS', KEYS[5], ARGV[1]) == 1 then
  return -1
end
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[3], ARGV[3], ARGV[4])
for i = 1, 3 do redis.call('EXPIRE', KEYS[i], ARGV[5]) end
return 1
"""


class BatchLines:
    """The batch lines of one (job, entry) through one endpoint (a judge, or the model under test)."""

    def __init__(self, r: redis.Redis, job_id: str, entry_key: str, name: str, config: EndpointConfig,
                 deployments: list[Deployment], deadline: float | None = None, ttl: int | None = None):
        self.r, self.job_id, self.entry_key, self.name, self.config = r, job_id, entry_key, name, config
        self.ttl = ttl or default_retention()  # the job's retention (its chunk's)
        batchable = [d for d in deployments if d.batch is not None]
        if not batchable:
            raise ValueError(f"{name!r} has no deployment that declares 'batch'")
        self.deployment = batchable[0]
        self.deadline = deadline  # auto: Unix time after which calls go synchronously

    def past_deadline(self, now: float | None = None) -> bool:
        return self.deadline is not None and (time.time() if now is None else now) >= self.deadline

    def reply(self, digest: str) -> bytes | None:
        return self.r.hget(keys.judge_memo(self.job_id), digest)

    def sync_reason(self, digest: str) -> str | None:
        """Why this call is sent synchronously, or None while it belongs to a batch."""
        if self.past_deadline():
            return "the auto deadline passed"
        reason = self.r.hget(keys.batch(self.job_id, "sync"), digest)
        return reason.decode() if reason is not None else None

    def tokens(self, request: dict) -> int:
        """What the line holds of its deployment's enqueued-token quota."""
        return estimate_tokens([request], self.config.max_tokens)

    def hold_lapse(self) -> float:
        """Seconds a line's hold of the cost caps lasts unsettled: until its auto deadline, else a
        provider's 24-hour window and a day more for the harvest."""
        if self.deadline is not None:
            return max(60.0, self.deadline - time.time() + 3600)
        return 2 * 86400.0

    def register(self, digest: str, request: dict, item: int, held=None, counted: int = 0) -> int:
        """Put the line in its region's queue, once per job: 1 when this call did (its
        holds, ``held`` of the cost cap and ``counted`` of the token cap, go with the line;
        the caller raises ``Pending``), 0 when it waits already and -1 when it was answered
        or sent synchronously meanwhile (either way the caller gives its holds back)."""
        line = {"e": self.entry_key, "j": self.name, "i": item, "b": request, "t": self.tokens(request),
                "h": held.json() if held is not None else 0, "k": counted, "n": 0, "r": self.deployment.region, "d": self.deadline}
        ttl = self.ttl
        self.r.sadd(keys.BATCH_JOBS, self.job_id)  # before the line: the manager finds what exists
        return int(self.r.eval(_REGISTER, 5, keys.batch(self.job_id, "line"),
                          keys.batch(self.job_id, f"queued:{self.deployment.region}"),
                          keys.batch(self.job_id, "touched"), keys.judge_memo(self.job_id),
                          keys.batch(self.job_id, "sync"), digest,
                          json.dumps(line, ensure_ascii=False, separators=(",", ":")),
                          self.deployment.region, repr(time.time()), str(ttl)))
