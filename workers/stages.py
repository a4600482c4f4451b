"""A job's stages (generation, then metrics) as streams of chunk tasks with a
per-stage counter, instead of Celery chords.

A chord's header lives whole in the sender's memory (a million instances of a
judge metric at 4 items per task is 250,000 signatures) and its join counter
can come up short when a worker dies at the wrong moment. Here:

- the plan is a generator over the spec stored in Redis, so the orchestrator,
  the ``evalq.jobs`` worker or a stage callback can send any stage in bounded
  memory, and ``resume`` can re-plan it;
- ``S:total`` (chunks in the stage) is written before the first task is sent
  and ``S:sent`` after each batch, so a sender that dies mid-stage is resumed
  where it stopped (a batch may go twice: chunks are idempotent);
- each finished chunk adds ``<metric key>:<start>`` to a set; the task whose
  addition completes the set (and only that one, by a Lua script) sends the
  stage's callback. A redelivered chunk adds nothing new, so nothing is
  counted twice.
"""

from __future__ import annotations

import itertools
import math
import time
from typing import Iterator, NamedTuple

import redis

from evalq.shared import keys
from evalq.shared.config import CONTROL_QUEUE
from evalq.shared.model import GENERATE

GENERATE_STAGE, METRICS_STAGE = "generate", "metrics"
CALLBACKS = {GENERATE_STAGE: "evalq.generated", METRICS_STAGE: "evalq.finalize"}
SEND_BATCH = 1000  # chunks sent between two ``S:sent`` checkpoints


class Chunk(NamedTuple):
    metric_key: str
    queue: str
    start: int
    stop: int
    deployment: str | None = None  # judge metrics: the region whose queue it goes to

    @property
    def id(self) -> str:
        return f"{self.metric_key}:{self.start}"


def stage_of(metric_key: str) -> str:
    return GENERATE_STAGE if metric_key == GENERATE else METRICS_STAGE


def stage_runs(spec: dict, stage: str) -> list[tuple[str, dict]]:
    """(metric key, spec entry) of each run of a stage, in job order."""
    if stage == GENERATE_STAGE:
        return [(GENERATE, spec[GENERATE])] if GENERATE in spec else []
    return list(spec["metrics"].items())


def span(spec: dict, entry: dict) -> int:
    """Instance positions (from the first) a run covers: all, unless a jailbreak's
    injected variants are for the safety metrics only."""
    return entry.get("span", spec["n_instances"])


def run_keys(spec: dict) -> list[str]:
    """Every run's key, in stage order: the generation stage's, then the metric entries'."""
    return [key for stage in (GENERATE_STAGE, METRICS_STAGE) for key, _ in stage_runs(spec, stage)]


def current_stage(spec: dict, status: str) -> str:
    """The stage a running job is in: generation, until its callback marks the job ``generated``."""
    return GENERATE_STAGE if GENERATE in spec and status != "generated" else METRICS_STAGE


def entry_chunks(spec: dict, entry: dict) -> int:
    """How many chunks a run is planned in."""
    return math.ceil(span(spec, entry) / entry["chunk_size"])


def stage_total(spec: dict, stage: str) -> int:
    return sum(entry_chunks(spec, entry) for _, entry in stage_runs(spec, stage))


def stage_items(spec: dict, stage: str) -> int:
    """Items the stage records when complete (the generation stage: only those without an output)."""
    if stage == GENERATE_STAGE:
        return spec[GENERATE]["n_items"] if GENERATE in spec else 0
    return sum(span(spec, entry) for entry in spec["metrics"].values())


def plan(spec: dict, stage: str) -> Iterator[Chunk]:
    """The stage's chunks, lazily and always in the same order.

    A run with ``regions`` (judge metrics, an endpoint model) spreads its chunks
    over its deployments in proportion to their TPM (smooth weighted round
    robin, one rotation per judge shared by all its metrics); at run time a
    worker still moves calls to a deployment with spare budget.
    """
    rotations: dict[str, Iterator[str]] = {}
    for key, entry in stage_runs(spec, stage):
        n = span(spec, entry)
        size = entry["chunk_size"]
        regions = None
        if entry.get("regions"):
            regions = rotations.setdefault(entry["rotation"], _weighted(entry["regions"]))
        for start in range(0, n, size):
            region = next(regions) if regions else None
            yield Chunk(key, queue_of(entry, region), start, min(start + size, n), region)


def queue_of(entry: dict, region: str | None) -> str:
    """The queue a run's chunk goes to: ``<kind>.<region>`` for runs with regions."""
    return f"{entry['queue']}.{region}" if region else entry["queue"]


def entry_queues(entry: dict) -> list[str]:
    """Every queue a run's chunks may go to."""
    return [queue_of(entry, region) for region, _ in entry.get("regions") or [[None, 0]]]


def _weighted(regions: list[list]) -> Iterator[str]:
    weights = {region: tpm for region, tpm in regions}
    current = dict.fromkeys(weights, 0)
    total = sum(weights.values())
    while True:
        for region, w in weights.items():
            current[region] += w
        best = max(current, key=current.get)
        current[best] -= total
        yield best


def send_stage(app, r: redis.Redis, job_id: str, spec: dict, stage: str,
               skip_done: bool = False) -> int:
    """Send the stage's chunk tasks from where an earlier sender stopped; returns how many were sent.

    With ``skip_done`` (resume) every chunk not yet finished is sent again,
    whatever ``S:sent`` says: the broker may have lost queued messages.
    """
    pkey = keys.plan(job_id)
    total = stage_total(spec, stage)
    r.hsetnx(pkey, f"{stage}:total", total)
    already = 0 if skip_done else int(r.hget(pkey, f"{stage}:sent") or 0)
    done = r.smembers(keys.chunks_done(job_id, stage)) if skip_done else set()
    sent = 0
    chunks = itertools.islice(plan(spec, stage), already, None)
    position = already
    seen_queues: set[str] = set()

    def declared(queue: str) -> list | None:
        # the queue's declaration once per send, not once per message (messages
        # go to the queue's list directly, workers declare what they consume)
        if queue in seen_queues:
            return []
        seen_queues.add(queue)
        return None

    with app.producer_or_acquire() as producer:
        while True:
            batch = list(itertools.islice(chunks, SEND_BATCH))
            if not batch:
                break
            if r.get(keys.status(job_id)) == b"cancelled":
                return sent
            # one pipelined round trip per batch (messages and their task-sent
            # events), not two per task: 250k tasks go in seconds, not minutes
            with producer.batch(max_size=2 * SEND_BATCH):
                for c in batch:
                    if c.id.encode() in done:
                        continue
                    app.send_task("evalq.score_chunk", args=(job_id, c.metric_key, c.start, c.stop),
                                  kwargs={"deployment": c.deployment} if c.deployment else {},
                                  queue=c.queue, producer=producer, ignore_result=True,
                                  declare=declared(c.queue))
                    sent += 1
            position += len(batch)
            if position > int(r.hget(pkey, f"{stage}:sent") or 0):
                r.hset(pkey, f"{stage}:sent", position)
    if total == 0 or stage_complete(r, job_id, stage):  # nothing to run, or all done already
        fire_callback(app, r, job_id, stage)
    return sent


# KEYS: chunks set, plan hash; ARGV: chunk id, stage. Returns 1 when this call
# completed the stage (the caller sends the callback), else 0.
_FINISH = """
local added = redis.call('SADD', KEYS[1], ARGV[1])
local total = tonumber(redis.call('HGET', KEYS[2], ARGV[2] .. ':total') or '-1')
if total >= 0 and redis.call('SCARD', KEYS[1]) >= total
   and redis.call('HSETNX', KEYS[2], ARGV[2] .. ':fired', ARGV[3]) == 1 then
  return 1
end
return 0
"""


def chunk_finished(app, r: redis.Redis, job_id: str, metric_key: str, start: int) -> bool:
    """Count a finished chunk; the one that completes its stage sends the stage's callback."""
    stage = stage_of(metric_key)
    fired = r.eval(_FINISH, 2, keys.chunks_done(job_id, stage), keys.plan(job_id),
                   f"{metric_key}:{start}", stage, str(time.time()))
    if fired:
        app.send_task(CALLBACKS[stage], args=(job_id,), queue=CONTROL_QUEUE, ignore_result=True)
    return bool(fired)


def stage_complete(r: redis.Redis, job_id: str, stage: str) -> bool:
    total = r.hget(keys.plan(job_id), f"{stage}:total")
    return total is not None and r.scard(keys.chunks_done(job_id, stage)) >= int(total)


def fire_callback(app, r: redis.Redis, job_id: str, stage: str, force: bool = False) -> bool:
    """Send the stage's callback once (``force``: again, e.g. on resume; callbacks are idempotent)."""
    if r.hsetnx(keys.plan(job_id), f"{stage}:fired", str(time.time())) or force:
        app.send_task(CALLBACKS[stage], args=(job_id,), queue=CONTROL_QUEUE, ignore_result=True)
        return True
    return False

