"""A job's stages (generation, then metrics) as streams of chunk tasks with a
per-stage counter, and the chunk-completion protocol workers call
(``chunk_finished``). Not Celery chords: a chord's header lives whole in the
sender's memory (a million instances of a judge metric at 4 items per task is
250,000 signatures) and its join counter can come up short when a worker dies
at the wrong moment. Here:

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
import time

import redis

from evalq.shared import keys
from evalq.shared.config import CONTROL_QUEUE
from evalq.shared.spec import GENERATE_STAGE, METRICS_STAGE, plan, stage_of, stage_total
from evalq.shared.status import Status, status_of

CALLBACKS = {GENERATE_STAGE: "evalq.generated", METRICS_STAGE: "evalq.finalize"}
SEND_BATCH = 1000  # chunks sent between two ``S:sent`` checkpoints


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
            if status_of(r, job_id) == Status.CANCELLED:
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

