"""Submit a validated job to the cluster and wait for its chord callback.

The job's instances and spec go to Redis once; each task names a chunk of
instance positions for one metric, so messages stay small whatever the
instances hold (and Flower shows readable arguments).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Callable

import redis

from shared import keys
from shared.config import CONTROL_QUEUE, Settings
from shared.errors import InfraError
from shared.job import Job

PUSH_BATCH = 5000


@dataclass(frozen=True)
class Chunk:
    metric_key: str
    queue: str
    start: int
    stop: int
    deployment: str | None = None  # judge metrics: the region whose queue it goes to


def plan(job: Job, chunk_size: int | None = None) -> list[Chunk]:
    """Expand a job into per-metric chunks of consecutive instances.

    A judge metric's chunks are spread over its judge's deployments in
    proportion to their TPM (smooth weighted round robin); at run time a
    worker still moves calls to a deployment with spare budget.
    """
    n = len(job.instances)
    chunks = []
    rotations: dict[str, object] = {}  # one per judge, shared by all its metrics
    for m in job.metrics:
        size = max(1, chunk_size or m.spec.chunk_size)
        regions = None
        if m.judge is not None:
            regions = rotations.setdefault(m.params.judge, _weighted_regions(m.judge))
        for start in range(0, n, size):
            region = next(regions) if regions else None
            queue = f"judge.{region}" if region else m.queue
            chunks.append(Chunk(m.key, queue, start, min(start + size, n), region))
    return chunks


def _weighted_regions(judge):
    weights = {d.region: d.tpm for d in judge.deployments}
    current = dict.fromkeys(weights, 0)
    total = sum(weights.values())
    while True:
        for region, w in weights.items():
            current[region] += w
        best = max(current, key=current.get)
        current[best] -= total
        yield best


def job_spec(job: Job) -> dict:
    metrics = {}
    for m in job.metrics:
        entry = {"id": m.id, "parameters": m.params_json(), "queue": m.queue}
        prepare = m.spec.load_prepare()
        if prepare is not None:
            entry["prepared"] = prepare(job.instances, m.params)
        metrics[m.key] = entry
    used = {m.params.judge for m in job.metrics if m.judge is not None}
    return {"source": job.source, "n_instances": len(job.instances), "metrics": metrics,
            # judge configurations name the key's environment variable, never the key
            "judges": {name: job.judges[name].model_dump(mode="json") for name in sorted(used)},
            "judging": job.judging.model_dump(mode="json")}


def connect(broker_url: str) -> redis.Redis:
    r = redis.Redis.from_url(broker_url, socket_connect_timeout=5, socket_timeout=60)
    try:
        r.ping()
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise InfraError(f"cannot reach broker {_safe_url(broker_url)}: {exc}") from None
    except redis.ResponseError as exc:
        raise InfraError(f"broker {_safe_url(broker_url)} refused: {exc}") from None
    return r


def _safe_url(url: str) -> str:
    # never print a password that may sit in the URL
    if "@" in url:
        scheme, _, rest = url.partition("://")
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


def store_job(r: redis.Redis, job: Job, job_id: str) -> None:
    ttl = Settings.from_env().result_ttl
    pipe = r.pipeline(transaction=False)
    pipe.set(keys.spec(job_id), json.dumps(job_spec(job)), ex=ttl)
    ikey = keys.instances(job_id)
    for i in range(0, len(job.instances), PUSH_BATCH):
        pipe.rpush(ikey, *(json.dumps(inst) for inst in job.instances[i:i + PUSH_BATCH]))
        pipe.execute()
    pipe.expire(ikey, ttl)
    pipe.set(keys.status(job_id), "running", ex=ttl)
    pipe.execute()


def submit(r: redis.Redis, broker_url: str, job: Job, chunk_size: int | None = None) -> tuple[str, str]:
    """Store the job and send its chord. Returns (job id, callback task id)."""
    from celery import chord

    from workers.app import client_app

    app = client_app(broker_url)
    job_id = uuid.uuid4().hex[:16]
    store_job(r, job, job_id)
    header = [
        app.signature("evalq.score_chunk", args=(job_id, c.metric_key, c.start, c.stop),
                      kwargs={"deployment": c.deployment} if c.deployment else {},
                      queue=c.queue, immutable=True)
        for c in plan(job, chunk_size)
    ]
    callback = app.signature("evalq.finalize", args=(job_id,), queue=CONTROL_QUEUE, immutable=True)
    try:
        callback_id = chord(header, app=app)(callback).id
    except Exception as exc:  # broker went away mid-submit: leave nothing behind
        delete_job(r, job, job_id)
        raise InfraError(f"submitting job {job_id} failed: {exc}") from None
    return job_id, callback_id


def delete_job(r: redis.Redis, job: Job, job_id: str) -> None:
    try:
        r.delete(*keys.all_job_keys(job_id, [m.key for m in job.metrics]))
    except redis.RedisError:
        pass


def items_done(r: redis.Redis, job: Job, job_id: str) -> int:
    pipe = r.pipeline(transaction=False)
    for m in job.metrics:
        pipe.hlen(keys.results(job_id, m.key))
    return sum(pipe.execute())


def wait(r: redis.Redis, broker_url: str, job: Job, job_id: str, callback_id: str,
         on_progress: Callable[[int], None], check: Callable[[], None],
         poll: float = 0.25, stall_timeout: float | None = None) -> list[dict]:
    """Poll until the callback has written the summary; return it.

    ``check`` raises InfraError when the workers are gone (embedded mode);
    ``stall_timeout`` bounds how long no item may finish before giving up.
    """
    from workers.app import client_app

    # The backend's stored state, not an AsyncResult: that one subscribes to
    # result pub/sub and complains at exit when the broker is already gone.
    backend = client_app(broker_url).backend
    last_done, last_change = -1, time.monotonic()
    while True:
        done = items_done(r, job, job_id)
        on_progress(done)
        if r.get(keys.status(job_id)) == b"done":
            return json.loads(r.get(keys.summary(job_id)))
        meta = backend.get_task_meta(callback_id)
        if meta.get("status") == "FAILURE":
            raise InfraError(f"job {job_id}: aggregation failed: {meta.get('result')!r}")
        check()
        now = time.monotonic()
        if done != last_done:
            last_done, last_change = done, now
        elif stall_timeout and now - last_change > stall_timeout:
            raise InfraError(f"job {job_id}: no progress for {stall_timeout:.0f} s "
                             f"({done} items done); are workers consuming queues "
                             f"{', '.join(job.queues)}?")
        time.sleep(poll)
