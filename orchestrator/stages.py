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
- each finished chunk adds ``<metric key>:<start>`` to a set (with its companions',
  ``evalq.shared.cluster.spec``); the task whose
  addition completes the set (and only that one, by a Lua script) sends the
  stage's callback. A redelivered chunk adds nothing new, so nothing is
  counted twice.
"""

from __future__ import annotations

import time

import redis

from evalq.shared.cluster import keys
from evalq.shared.core.config import CONTROL_QUEUE
from evalq.shared.cluster.spec import GENERATE_STAGE, METRICS_STAGE, chunk_ids, stage_of, stage_total
from evalq.shared.job.stored import StoredJob, stored_job  # noqa: F401  (StoredJob: a hint)
from evalq.shared.cluster.status import Status, status_of

CALLBACKS = {GENERATE_STAGE: "evalq.generated", METRICS_STAGE: "evalq.finalize"}


def send_stage(app, r: redis.Redis, job_id: str, spec: "StoredJob | dict", stage: str,
               skip_done: bool = False) -> int:
    """Put the stage's chunks in line (``evalq.orchestrator.dispatch``) from where an earlier
    sender stopped, and fill the room its queues have; returns how many chunks were put in line.

    With ``skip_done`` (resume) every chunk not yet finished is put in line again, whatever
    ``S:sent`` says: the broker may have lost queued messages.
    """
    from evalq.orchestrator import dispatch

    pkey = keys.plan(job_id)
    total = stage_total(spec, stage)
    r.hsetnx(pkey, f"{stage}:total", total)
    if status_of(r, job_id) == Status.CANCELLED:
        return 0
    queues, count = dispatch.enqueue(r, job_id, spec, stage, skip_done=skip_done)
    dispatch.send_now(app, r, queues)
    if total == 0 or stage_complete(r, job_id, stage):  # nothing to run, or all done already
        fire_callback(app, r, job_id, stage)
    return count


# KEYS: chunks set, plan hash; ARGV: stage, time, then the chunk ids (a chunk, and those of the
# entries scored with it: added at once). Returns 1 when this call completed the stage (the
# caller sends the callback), else 0.
_FINISH = """
redis.call('SADD', KEYS[1], unpack(ARGV, 3))
local total = tonumber(redis.call('HGET', KEYS[2], ARGV[1] .. ':total') or '-1')
if total >= 0 and redis.call('SCARD', KEYS[1]) >= total
   and redis.call('HSETNX', KEYS[2], ARGV[1] .. ':fired', ARGV[2]) == 1 then
  return 1
end
return 0
"""


def chunk_finished(app, r: redis.Redis, job_id: str, metric_key: str, start: int,
                   queue: str | None = None) -> bool:
    """The one completion entry point workers call: count a finished chunk (the one that
    completes its stage sends the stage's callback), free its slot on ``queue`` and refill it.
    A chunk that also scored its entry's companions counts for each of them, in the same step."""
    stage = stage_of(metric_key)
    try:
        ids = chunk_ids(stored_job(r, job_id), metric_key, start)
    except LookupError:  # the job's keys are gone: nothing left to count
        ids = [f"{metric_key}:{start}"]
    fired = r.eval(_FINISH, 2, keys.chunks_done(job_id, stage), keys.plan(job_id),
                   stage, str(time.time()), *ids)
    if fired:
        app.send_task(CALLBACKS[stage], args=(job_id,), queue=CONTROL_QUEUE, ignore_result=True)
    if queue:
        slot_freed(app, r, queue)
    return bool(fired)


def slot_freed(app, r: redis.Redis, queue: str) -> None:
    """A chunk sent on ``queue`` ended (finished, given up, or dropped unrun): the next goes."""
    from evalq.orchestrator import dispatch

    if queue:
        dispatch.chunk_done(r, queue)
        dispatch.refill(app, r, queue)


def callback_lease(r: redis.Redis, job_id: str, stage: str, owner: str = ""):
    """The lease a stage's callback holds while it runs (``evalq.shared.cluster.leases``): one copy
    works at a time; a copy that finds it held ends at once, and the lookers-after send no
    other while it is renewed (``callback_running``)."""
    from evalq.shared.core.config import Settings
    from evalq.shared.cluster.leases import Lease

    return Lease(r, keys.callback_lease(job_id, stage), Settings.from_env().callback_lease, owner)


def callback_running(r: redis.Redis, job_id: str, stage: str) -> bool:
    return bool(r.exists(keys.callback_lease(job_id, stage)))


def stage_complete(r: redis.Redis, job_id: str, stage: str) -> bool:
    total = r.hget(keys.plan(job_id), f"{stage}:total")
    return total is not None and r.scard(keys.chunks_done(job_id, stage)) >= int(total)


def fire_callback(app, r: redis.Redis, job_id: str, stage: str, force: bool = False) -> bool:
    """Send the stage's callback once (``force``: again, e.g. on resume; callbacks are idempotent),
    but never while one runs: a second copy would do the same work beside it."""
    if r.hsetnx(keys.plan(job_id), f"{stage}:fired", str(time.time())) or (
            force and not callback_running(r, job_id, stage)):
        app.send_task(CALLBACKS[stage], args=(job_id,), queue=CONTROL_QUEUE, ignore_result=True)
        return True
    return False

