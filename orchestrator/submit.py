"""Submit a validated job to the cluster and wait for its chord callback.

The job's instances and spec go to Redis once; each task names a chunk of
instance positions for one metric, so messages stay small whatever the
instances hold (and Flower shows readable arguments).
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import redis

from evalq.shared import keys
from evalq.shared.config import CONTROL_QUEUE, Settings
from evalq.shared.errors import InfraError
from evalq.shared.instances import json_lines
from evalq.shared.job import Job, MetricRun
from evalq.shared.model import GENERATE

PUSH_BATCH = 5000
CALLBACK_GRACE = 10.0  # seconds all items may be recorded before the callback is sent directly


@dataclass(frozen=True)
class Chunk:
    metric_key: str
    queue: str
    start: int
    stop: int
    deployment: str | None = None  # judge metrics: the region whose queue it goes to


def plan(job: Job, chunk_size: int | None = None, runs: list[MetricRun] | None = None) -> list[Chunk]:
    """Expand runs (by default the job's metrics) into chunks of consecutive instances.

    A judge metric's chunks (and the generation stage's) are spread over its
    deployments in proportion to their TPM (smooth weighted round robin); at
    run time a worker still moves calls to a deployment with spare budget.
    """
    n = len(job.instances)
    chunks = []
    rotations: dict[str, object] = {}  # one per judge, shared by all its metrics
    for m in job.metrics if runs is None else runs:
        size = max(1, chunk_size or m.spec.chunk_size)
        regions = None
        if m.judge is not None:
            regions = rotations.setdefault(getattr(m.params, "judge", m.key), _weighted_regions(m.judge))
        for start in range(0, n, size):
            region = next(regions) if regions else None
            queue = f"{m.spec.queue}.{region}" if region else m.queue
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
        if m.name is not None:
            entry["name"] = m.name
        prepare = m.spec.load_prepare()
        if prepare is not None:
            entry["prepared"] = prepare(job.instances, m.params)
        metrics[m.key] = entry
    used = {m.params.judge for m in job.metrics if m.judge is not None}
    spec = {"source": job.source, "n_instances": len(job.instances), "metrics": metrics,
            # judge and model configurations name the key's environment variable, never the key
            "judges": {name: job.judges[name].model_dump(mode="json") for name in sorted(used)},
            "judging": job.judging.model_dump(mode="json"), "categories": job.categories}
    generation = job.generation
    if generation is not None:
        spec[GENERATE] = {"id": GENERATE, "parameters": generation.params_json(), "n_items": job.n_to_generate}
        spec["model"] = job.model.model_dump(mode="json")
    return spec


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


def store_job(r: redis.Redis, job: Job) -> str:
    """Put the job's spec and instances in Redis; returns the new job id."""
    job_id = uuid.uuid4().hex[:16]
    ttl = Settings.from_env().result_ttl
    try:
        pipe = r.pipeline(transaction=False)
        pipe.set(keys.spec(job_id), json.dumps(job_spec(job)), ex=ttl)
        ikey = keys.instances(job_id)
        for batch in _batches(json_lines(job.instances), PUSH_BATCH):
            pipe.rpush(ikey, *batch)
            pipe.execute()
        pipe.expire(ikey, ttl)
        pipe.set(keys.status(job_id), "running", ex=ttl)
        pipe.execute()
    except redis.RedisError as exc:
        delete_job(r, job, job_id)
        raise InfraError(f"storing job {job_id} failed: {exc}") from None
    return job_id


def _batches(items: Iterable[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def send(r: redis.Redis, broker_url: str, job: Job, job_id: str, runs: list[MetricRun], callback: str,
         chunk_size: int | None = None) -> str:
    """Send one stage's chord (``runs`` chunked, then ``callback``); returns the callback's id."""
    from celery import chord

    from evalq.workers.app import client_app

    app = client_app(broker_url)
    header = [
        app.signature("evalq.score_chunk", args=(job_id, c.metric_key, c.start, c.stop),
                      kwargs={"deployment": c.deployment} if c.deployment else {},
                      queue=c.queue, immutable=True)
        for c in plan(job, chunk_size, runs)
    ]
    signature = app.signature(callback, args=(job_id,), queue=CONTROL_QUEUE, immutable=True)
    try:
        return chord(header, app=app)(signature).id
    except Exception as exc:  # broker went away mid-submit: leave nothing behind
        delete_job(r, job, job_id)
        raise InfraError(f"submitting job {job_id} failed: {exc}") from None


def delete_job(r: redis.Redis, job: Job, job_id: str) -> None:
    try:
        r.delete(*keys.all_job_keys(job_id, [m.key for m in job.runs]))
    except redis.RedisError:
        pass


def items_done(r: redis.Redis, job: Job, job_id: str) -> int:
    pipe = r.pipeline(transaction=False)
    for m in job.runs:
        pipe.hlen(keys.results(job_id, m.key))
    return sum(pipe.execute())


def wait(r: redis.Redis, broker_url: str, job: Job, job_id: str, callback_id: str, until: str,
         on_progress: Callable[[int], None], check: Callable[[], None],
         poll: float = 0.25, stall_timeout: float | None = None,
         callback: str | None = None, expected: int | None = None) -> None:
    """Poll until the job's status reaches ``until`` (set by the stage's callback).

    ``check`` raises InfraError when the workers are gone (embedded mode);
    ``stall_timeout`` bounds how long no item may finish before giving up.
    When all ``expected`` items are recorded and the chord's callback still has
    not run after a grace period, ``callback`` is sent directly: a worker
    killed between storing a task's result and counting it in the chord
    (Celery logs "succeeded before the worker was lost") leaves the chord one
    part short for ever. The callbacks are idempotent, so a late chord
    callback as well does no harm.
    """
    from evalq.workers.app import client_app

    # The backend's stored state, not an AsyncResult: that one subscribes to
    # result pub/sub and complains at exit when the broker is already gone.
    app = client_app(broker_url)
    backend = app.backend
    last_done, last_change = -1, time.monotonic()
    complete_since, nudged = None, False
    while True:
        done = items_done(r, job, job_id)
        on_progress(done)
        if r.get(keys.status(job_id)) == until.encode():
            return
        meta = backend.get_task_meta(callback_id)
        if meta.get("status") == "FAILURE":
            raise InfraError(f"job {job_id}: aggregation failed: {meta.get('result')!r}")
        check()
        now = time.monotonic()
        if expected is not None and done >= expected:
            complete_since = complete_since or now
            if callback and not nudged and now - complete_since > CALLBACK_GRACE:
                print(f"evalq: job {job_id}: every item is recorded but the chord callback has not run "
                      f"(a worker was lost at the wrong moment); running {callback} directly", file=sys.stderr)
                app.send_task(callback, args=(job_id,), queue=CONTROL_QUEUE)
                nudged = True
        if done != last_done:
            last_done, last_change = done, now
        elif stall_timeout and now - last_change > stall_timeout:
            raise InfraError(f"job {job_id}: no progress for {stall_timeout:.0f} s "
                             f"({done} items done); are workers consuming queues "
                             f"{', '.join(job.queues)}?")
        time.sleep(poll)


def run_stages(r: redis.Redis, broker_url: str, job: Job, chunk_size: int | None,
               on_progress: Callable[[int], None], check: Callable[[], None],
               stall_timeout: float | None) -> str:
    """Store the job, generate missing outputs (when the job has a model), then
    score every metric. Returns the job id once the summary is in Redis."""
    job_id = store_job(r, job)
    stages = [([job.generation], "evalq.generated", "generated", job.n_to_generate)] if job.generation else []
    stages.append((job.metrics, "evalq.finalize", "done",
                   job.n_to_generate + len(job.instances) * len(job.metrics)))
    for runs, callback, until, expected in stages:
        callback_id = send(r, broker_url, job, job_id, runs, callback, chunk_size)
        wait(r, broker_url, job, job_id, callback_id, until, on_progress, check, stall_timeout=stall_timeout,
             callback=callback, expected=expected)
    return job_id


def summaries(r: redis.Redis, job_id: str) -> tuple[list[dict], dict | None]:
    """(results.json content, the generation stage's summary or None)."""
    stage = r.get(keys.stage_summary(job_id, GENERATE))
    return json.loads(r.get(keys.summary(job_id))), (json.loads(stage) if stage else None)
