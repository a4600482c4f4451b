"""Put a validated job on the cluster, and follow it.

The job's instances and spec go to Redis once; each task names a chunk of
instance positions for one metric entry, so messages stay small whatever the
instances hold (and Flower shows readable arguments). From then on the cluster
owns the job (``evalq.workers.stages``): the last chunk of a stage sends its
callback, the generation callback sends the metrics stage, and the final
callback writes the outputs. Whoever submitted may wait, or go away.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable, Iterator

import redis

from evalq.orchestrator.outage import Outage
from evalq.shared import keys
from evalq.shared.config import Settings
from evalq.shared.errors import InfraError
from evalq.shared.instances import json_lines
from evalq.shared.job import Job, MetricRun
from evalq.shared.model import GENERATE, RUNNER_QUEUE
from evalq.shared.registry import sized_chunk
from evalq.shared.storage import Destination
from evalq.workers.stages import GENERATE_STAGE, METRICS_STAGE, Chunk, plan as plan_spec  # noqa: F401

PUSH_BATCH = 5000
TERMINAL = ("done", "failed", "cancelled")


def run_entry(m: MetricRun, chunk_size: int | None, items: int) -> dict:
    """How a run's chunks are planned: its size, queue and (judges, endpoint models) regions."""
    entry: dict = {"chunk_size": max(1, chunk_size or m.spec.chunk_size or sized_chunk(items))}
    if m.judge is not None:
        entry["queue"] = m.spec.queue
        entry["regions"] = [[d.region, d.tpm] for d in m.judge.deployments]
        entry["rotation"] = GENERATE if m.key == GENERATE else getattr(m.params, "judge", m.key)
    else:
        entry["queue"] = RUNNER_QUEUE if m.spec.queue == "generate" else m.spec.queue
    return entry


def plan(job: Job, chunk_size: int | None = None, runs: list[MetricRun] | None = None) -> Iterator[Chunk]:
    """The chunks of ``runs`` (by default the job's metrics), as the cluster will plan them."""
    runs = job.metrics if runs is None else runs
    spec = {"n_instances": len(job.instances),
            "metrics": {m.key: {**run_entry(m, chunk_size, job.span(m)), "span": job.span(m)}
                        for m in runs if m.key != GENERATE}}
    gen = [m for m in runs if m.key == GENERATE]
    if gen:
        spec[GENERATE] = run_entry(gen[0], chunk_size, len(job.instances))
        yield from plan_spec(spec, GENERATE_STAGE)
    yield from plan_spec(spec, METRICS_STAGE)


def job_spec(job: Job, chunk_size: int | None = None, out: Destination | str | None = None,
             request_id: str | None = None, reply_to: str | None = None) -> dict:
    ttl = Settings.from_env().result_ttl
    metrics = {}
    for m in job.metrics:
        entry = {"id": m.id, "parameters": m.params_json(), **run_entry(m, chunk_size, job.span(m))}
        if job.span(m) != len(job.instances):  # a jailbreak's injected variants: safety metrics only
            entry["span"] = job.span(m)
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
            "judging": job.judging.model_dump(mode="json"), "categories": job.categories,
            "submitted_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "ttl": ttl}
    if out is not None:
        dest = out if isinstance(out, Destination) else Destination(out)
        # a local folder as an absolute path: the callback may run in another directory
        spec["out"] = dest.uri if dest.s3 else str(Path(dest.uri).expanduser().resolve())
        if dest.endpoint_url:
            spec["out_endpoint_url"] = dest.endpoint_url
    if request_id is not None:
        spec["request_id"] = request_id
    if reply_to is not None:
        spec["reply_to"] = reply_to
    if job.dataset is not None:
        spec["dataset"] = {"uri": job.dataset.uri, "format": job.dataset.format, "read_as": job.mapping,
                           "bad_records_skipped": job.bad_records.count}
        if job.bad_records.shown:
            spec["dataset"]["bad_records"] = job.bad_records.shown
    if job.jailbreak is not None:
        spec["jailbreak"] = {"n_clean": job.n_clean, "n_injected": len(job.instances) - job.n_clean,
                             **({"template": job.jailbreak.template} if job.jailbreak.template is not None
                                else {"dataset": job.jailbreak.dataset.uri})}
    generation = job.generation
    if generation is not None:
        spec[GENERATE] = {"id": GENERATE, "parameters": generation.params_json(), "n_items": job.n_to_generate,
                          **run_entry(generation, chunk_size, len(job.instances))}
        spec["model"] = job.model.model_dump(mode="json")
    return spec


def destination(job: Job, out: str | None) -> Destination | None:
    """Where a job's outputs go: ``out`` (with the S3 endpoint the job names for
    its output or dataset), else the job's ``output``; None when neither says."""
    if out is None:
        return Destination(job.output.uri, job.output.endpoint_url) if job.output is not None else None
    endpoint = (job.output.endpoint_url if job.output else None) or \
        (job.dataset.endpoint_url if job.dataset else None)
    return Destination(out, endpoint)


def connect(broker_url: str, outage: Outage | None = None) -> redis.Redis:
    """A client for the broker's Redis, checked with a ping. A client that waits
    rides out an outage through ``outage`` alone (redis-py's own retries off), so it
    says at once that Redis is unreachable."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from evalq.shared.config import redis_client, safe_url

    retries = {"retry": Retry(NoBackoff(), 0)} if outage is not None else {}
    r = redis_client(broker_url, socket_connect_timeout=5, socket_timeout=60, **retries)
    try:
        if outage is not None:
            outage.call(r.ping)
        else:
            r.ping()
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise InfraError(f"cannot reach broker {safe_url(broker_url)}: {exc}") from None
    except redis.ResponseError as exc:
        raise InfraError(f"broker {safe_url(broker_url)} refused: {exc}") from None
    return r


def new_job_id() -> str:
    return uuid.uuid4().hex[:16]


def store_job(r: redis.Redis, job: Job, spec: dict, job_id: str | None = None) -> str:
    """Put the job's spec and instances in Redis; returns the job id.

    With a given ``job_id`` (a redelivered request) whatever an earlier attempt
    left half-stored is replaced first.
    """
    job_id = job_id or new_job_id()
    ttl = spec["ttl"]
    try:
        if r.exists(keys.instances(job_id)):
            r.delete(keys.instances(job_id))
        pipe = r.pipeline(transaction=False)
        ikey = keys.instances(job_id)
        for batch in _batches(json_lines(job.instances), PUSH_BATCH):
            pipe.rpush(ikey, *batch)
            pipe.execute()
        pipe.expire(ikey, ttl)
        # the spec last: a job with a spec has all its instances
        pipe.set(keys.spec(job_id), json.dumps(spec), ex=ttl)
        pipe.set(keys.status(job_id), "running", ex=ttl)
        pipe.zadd(keys.JOBS, {job_id: time.time()})
        pipe.execute()
    except redis.RedisError as exc:
        delete_job(r, job_id, [m.key for m in job.runs])
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


def start(r: redis.Redis, broker_url: str, job_id: str, spec: dict) -> None:
    """Send the job's first stage; the cluster does the rest."""
    from evalq.workers.app import client_app
    from evalq.workers.stages import send_stage

    stage = GENERATE_STAGE if GENERATE in spec else METRICS_STAGE
    try:
        send_stage(client_app(broker_url), r, job_id, spec, stage)
    except (redis.RedisError, OSError) as exc:
        raise InfraError(f"submitting job {job_id} failed: {exc}") from None


def submit(r: redis.Redis, broker_url: str, job: Job, chunk_size: int | None = None,
           out: Destination | str | None = None,
           request_id: str | None = None, reply_to: str | None = None, job_id: str | None = None) -> str:
    """Store and start a job; returns its id at once."""
    spec = job_spec(job, chunk_size, out, request_id, reply_to)
    job_id = store_job(r, job, spec, job_id)
    start(r, broker_url, job_id, spec)
    return job_id


def delete_job(r: redis.Redis, job_id: str, metric_keys: list[str]) -> None:
    try:
        r.delete(*keys.all_job_keys(job_id, metric_keys))
        r.zrem(keys.JOBS, job_id)
    except redis.RedisError:
        pass


def wait(r: redis.Redis, broker_url: str, job_id: str, on_progress: Callable[[int], None],
         check: Callable[[], None], poll: float = 0.25, stall_timeout: float | None = None,
         outage: Outage | None = None) -> str:
    """Poll until the job reaches a final status (set by its last callback); returns it.

    ``check`` raises InfraError when the workers are gone (embedded mode);
    ``stall_timeout`` bounds how long no item may finish before giving up.
    While it waits, the client looks after the job as the cluster's sweeper
    does (``evalq.orchestrator.watch``): a stage whose callback was lost gets
    it again, a job whose messages were lost gets its unfinished chunks again.
    Every Redis access rides out an outage (``outage``; by default up to the
    stall timeout, else 300 s), which does not count as a stall.
    """
    from evalq.orchestrator.watch import Timing

    outage = outage or Outage(broker_url, stall_timeout or 300)
    spec = json.loads(outage.call(r.get, keys.spec(job_id)) or "null")
    if spec is None:
        raise InfraError(f"job {job_id}: no such job (expired or never submitted)")
    timing = Timing.from_env()
    last_done, last_change = -1, time.monotonic()
    while True:
        done, status, actions = outage.call(_look, r, broker_url, job_id, spec, timing)
        on_progress(done)
        if status in TERMINAL:
            return status
        if not status:
            raise InfraError(f"job {job_id}: its keys are gone from Redis (expired or deleted)")
        check()
        for action in actions:
            print(f"evalq: {action}", file=sys.stderr)
        now = time.monotonic()
        last_change = max(last_change, outage.ended_at)  # time Redis was away is no stall
        if done != last_done:
            last_done, last_change = done, now
        elif stall_timeout and now - last_change > stall_timeout:
            raise InfraError(f"job {job_id}: no progress for {stall_timeout:.0f} s "
                             f"({done} items done); are workers consuming the job's queues?")
        time.sleep(poll)


def _look(r: redis.Redis, broker_url: str, job_id: str, spec: dict, timing) -> tuple[int, str, list[str]]:
    """One look at a job being waited on: (items done, status, steps taken to look after it)."""
    from evalq.orchestrator.watch import items_done, look_after
    from evalq.workers.stages import run_keys

    counts = items_done(r, job_id, run_keys(spec))
    status = (r.get(keys.status(job_id)) or b"").decode()
    if not status or status in TERMINAL:
        return sum(counts.values()), status, []
    return sum(counts.values()), status, look_after(r, broker_url, job_id, spec, status, counts, timing)


def summaries(r: redis.Redis, job_id: str) -> tuple[list[dict], dict | None]:
    """(results.json content, the generation stage's summary or None)."""
    stage = r.get(keys.stage_summary(job_id, GENERATE))
    return json.loads(r.get(keys.summary(job_id))), (json.loads(stage) if stage else None)
