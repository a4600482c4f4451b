"""Put a validated job on the cluster.

The job's instances and spec go to Redis once; each task names a chunk of
instance positions for one metric entry, so messages stay small whatever the
instances hold (and Flower shows readable arguments). From then on the cluster
owns the job (``evalq.orchestrator.stages``): the last chunk of a stage sends its
callback, the generation callback sends the metrics stage, and the final
callback writes the outputs. Whoever submitted may wait (``evalq.cli.wait``), or go away.
"""

from __future__ import annotations

import json

import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from evalq.shared.cluster import keys
from evalq.shared.core.config import Settings
from evalq.shared.core.errors import InfraError
from evalq.shared.data.instances import json_lines, stored_bytes
from evalq.shared.data.versions import TABLE_FILE
from evalq.shared.job.schema import Job, MetricRun
from evalq.shared.job.stored import VERSION, StoredJob, as_stored, store as store_document
from evalq.shared.model.runners import GENERATE
from evalq.shared.metrics.registry import device_chunk, judge_chunk, sized_chunk
from evalq.shared.data.storage import Destination
from evalq.shared.cluster.spec import (GENERATE_STAGE, METRICS_STAGE, Chunk, has_model_stage, is_model_run,  # noqa: F401
                               is_variants, plan as plan_spec, variants_of)
from evalq.shared.cluster.status import Status
from evalq.shared.store.place import Place
from evalq.shared.store.groups import part_size
from evalq.shared.store.records import PARTS

if TYPE_CHECKING:  # redis-py is imported where a client is used: `evalq run` reads the job,
    import redis  # picks its destination and starts its workers before it needs one

PUSH_BATCH = 5000
FROM_ENV = object()  # store_job's store: the operator's (EVALQ_STORE), or none


def run_entry(m: MetricRun, chunk_size: int | None, items: int) -> dict:
    """How a run's chunks are planned: its size, queue and (judges, endpoint models) regions."""
    if chunk_size is None and m.spec.device_chunk is not None:
        chunk_size = device_chunk(items, *m.spec.device_chunk)
    if chunk_size is None and m.spec.queue == "judge":
        chunk_size = judge_chunk(items, m.spec.chunk_size)
    entry: dict = {"chunk_size": max(1, chunk_size or m.spec.chunk_size or sized_chunk(items)), **m.routing()}
    grouped = part_size(entry["chunk_size"], items) if m.spec.queue == "judge" else None
    if grouped:  # its records in parts of 1,000+ items
        entry["part_size"] = grouped
    if m.judge is not None:
        entry["rotation"] = GENERATE if is_model_run(m.key) else getattr(m.params, "judge", m.key)
    return entry


GROUPED_QUEUES = ("cpu", "gpu")


def _groups(metrics: dict[str, dict], runs: list[MetricRun], n_instances: int) -> list[list[MetricRun]]:
    """The job's entries in the groups they are scored in (``group_entries``), each group's members
    in the job's order: entries of the cpu or gpu queue that call no endpoint and read no variants,
    over the same instances in chunks of the same size, share one; every other entry, and every
    entry with ``EVALQ_GROUP_ENTRIES=0``, is a group of its own."""
    together = Settings.from_env().group_entries
    groups: dict[tuple, list[MetricRun]] = {}
    for m in runs:
        entry = metrics.get(m.key)
        if entry is None:
            continue
        key = None
        if together and entry.get("queue") in GROUPED_QUEUES and not entry.get("regions") \
                and not m.spec.calls_endpoint and not m.spec.variants:
            key = (entry["queue"], entry["chunk_size"], entry.get("span", n_instances))
        groups.setdefault(key or ("alone", m.key), []).append(m)
    return list(groups.values())


def group_entries(metrics: dict[str, dict], runs: list[MetricRun], n_instances: int) -> None:
    """Mark the metric entries scored together (``evalq.shared.cluster.spec``; which: ``_groups``).
    The first of each such group leads it (``companions``); the others name it (``led_by``). A
    chunk of the group reads and decodes its instances once for all of them. Off with
    ``EVALQ_GROUP_ENTRIES=0`` (each entry's chunks then spread on their own)."""
    for leader, *others in _groups(metrics, runs, n_instances):
        for m in others:
            metrics[leader.key].setdefault("companions", []).append(m.key)
            metrics[m.key]["led_by"] = leader.key


def size_cheap(metrics: dict[str, dict], runs: list[MetricRun], instances: Any, chunk_size: int | None) -> None:
    """Give the entries of cheap metrics (the registry's ``item_us``: exact_match, f1_score) chunks
    sized by their work (``sized_chunk``) rather than by their count alone, so that a task's fixed
    cost stays small beside a metric of microseconds. Entries scored together (``group_entries``)
    are sized by the sum of their costs, and only when every one of them has one: a group keeps one
    chunk size, and one with bleu or rouge in it already has work enough per item. Not with a
    ``chunk_size`` the job or the command gives. Within CHEAP_CHUNK_BYTES of ``instances``."""
    if chunk_size is not None:
        return
    n_instances, item_bytes = len(instances), None
    for members in _groups(metrics, runs, n_instances):
        costs = [None if m.spec.chunk_size or m.spec.device_chunk else m.spec.item_us for m in members]
        if None in costs:
            continue
        if item_bytes is None:
            item_bytes = stored_bytes(instances)
        span = metrics[members[0].key].get("span", n_instances)
        for m in members:
            metrics[m.key]["chunk_size"] = sized_chunk(span, sum(costs), item_bytes)


def plan(job: Job, chunk_size: int | None = None, runs: list[MetricRun] | None = None) -> Iterator[Chunk]:
    """The chunks of ``runs`` (by default the job's metrics), as the cluster will plan them."""
    return chunks_of(outline(job, chunk_size, runs))


def chunks_of(spec: dict) -> Iterator[Chunk]:
    """The chunks of a job's ``outline`` (or of its spec), the generation stage's first."""
    if has_model_stage(spec):
        yield from plan_spec(spec, GENERATE_STAGE)
    yield from plan_spec(spec, METRICS_STAGE)


def outline(job: Job, chunk_size: int | None = None, runs: list[MetricRun] | None = None) -> dict:
    """What the plan reads of the job's spec (chunk sizes, queues, entries scored together),
    without the rest ``job_spec`` makes (idf tables, judges): for counting and showing the plan."""
    runs = job.metrics if runs is None else runs
    metrics = {m.key: {**run_entry(m, chunk_size, job.span(m)), "span": job.span(m)}
               for m in runs if not is_model_run(m.key)}
    size_cheap(metrics, runs, job.instances, chunk_size)
    group_entries(metrics, runs, len(job.instances))
    spec = {"n_instances": len(job.instances), "metrics": metrics}
    gen = [m for m in runs if m.key == GENERATE]
    if gen:
        spec[GENERATE] = run_entry(gen[0], chunk_size, len(job.instances))
    spec["variants"] = {variants_of(m.key): {**run_entry(m, chunk_size, job.span(m)), "span": job.span(m)}
                        for m in runs if is_variants(m.key)}
    return spec


def job_spec(job: Job, chunk_size: int | None = None, out: Destination | str | None = None,
             request_id: str | None = None, reply_to: str | None = None, namespace: str | None = None,
             message_id: str | None = None, fingerprint: str | None = None) -> dict:
    """The job's stored document (``evalq.shared.job.stored``: read back as a ``StoredJob``), built once:
    ``namespace``, the tenant of the request queue it came through (the final callback writes only into
    its places); ``message_id``, the queue message that carried it, and ``fingerprint`` what it asked
    (``evalq.orchestrator.service``: the binding of its request id, rebuilt from it after a loss)."""
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
    size_cheap(metrics, job.metrics, job.instances, chunk_size)
    group_entries(metrics, job.metrics, len(job.instances))
    used = {m.params.judge for m in job.metrics if m.judge is not None}
    used |= {member for m in job.metrics if m.judge is not None for member in getattr(m.params, "panel", None) or ()}
    spec = {"version": VERSION, "source": job.source, "n_instances": len(job.instances), "metrics": metrics,
            # judge and model configurations name the key's environment variable, never the key
            "judges": {name: job.judges[name].model_dump(mode="json") for name in sorted(used)},
            "judging": job.judging.model_dump(mode="json"), "categories": job.categories,
            "scheduling": job.scheduling.model_dump(mode="json"),
            # the history store's series, and how its regressions are judged (evalq.results.history)
            "suite": job.suite, "regression": job.regression.model_dump(mode="json"),
            "review": job.review.model_dump(mode="json"),  # the items put in front of people (evalq.results.review)
            "submitted_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "ttl": ttl}
    if job.output is not None and not job.output.log_parameters:
        spec["log_parameters"] = False  # log.jsonl lines name their entry by position only
    if job.output is not None and job.output.otel is not None:
        spec["otel_export"] = job.output.otel  # false, or the operator's exporter by name (evalq.results.sinks)
    if job.output is not None and job.output.sinks:
        spec["sinks"] = list(job.output.sinks)  # the operator's score sinks by name (evalq.results.sinks)
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
    if namespace is not None:
        spec["namespace"] = namespace
    if message_id is not None:
        spec["message_id"] = message_id
    if fingerprint is not None:
        spec["request_fingerprint"] = fingerprint
    if job.dataset is not None:
        dataset = {"uri": job.dataset.uri, "format": job.dataset.format, "read_as": job.mapping,
                   "bad_records_skipped": job.bad_records.count}
        if job.bad_records.shown:
            dataset["bad_records"] = job.bad_records.shown
        if job.spans is not None:  # OTLP traces: spans read, passed by, filtered, sampled; instances made
            dataset["spans"] = job.spans
            dataset["traces"] = job.dataset.traces.model_dump(mode="json")  # since/until as resolved
        spec["dataset"] = dataset
    if job.jailbreak is not None:
        spec["jailbreak"] = {"n_clean": job.n_clean, "n_injected": len(job.instances) - job.n_clean,
                             **({"template": job.jailbreak.template} if job.jailbreak.template is not None
                                else {"dataset": job.jailbreak.dataset.uri})}
    generation = job.generation
    if generation is not None:
        spec[GENERATE] = {"id": GENERATE, "parameters": generation.params_json(), "n_items": job.n_to_generate,
                          **run_entry(generation, chunk_size, len(job.instances))}
    if job.variant_runs:
        # the model answers each instance's variants for these entries, through the prompt template
        spec["variants"] = {variants_of(v.key): {
            "id": v.id, "parameters": v.params_json(), "prompt_template": job.model.prompt_template,
            **({"span": job.span(v)} if job.span(v) != len(job.instances) else {}),
            **run_entry(v, chunk_size, job.span(v))} for v in job.variant_runs}
    if generation is not None or job.variant_runs:
        spec["model"] = job.model.model_dump(mode="json")
    return spec


def destination(job: Job, out: str | None) -> Destination | None:
    """Where a job's outputs go: ``out`` (with the S3 endpoint the job names for
    its output or dataset), else the job's ``output``; None when neither says."""
    if out is None:
        return Destination(job.output.uri, job.output.endpoint_url) if job.output and job.output.uri else None
    endpoint = (job.output.endpoint_url if job.output else None) or \
        (job.dataset.endpoint_url if job.dataset else None)
    return Destination(out, endpoint)


def new_job_id() -> str:
    return uuid.uuid4().hex[:16]


def store_job(r: redis.Redis, job: Job, spec: dict, job_id: str | None = None,
              store: Place | None | object = FROM_ENV) -> str:
    """Put the job's instances in the job store (``evalq.shared.store``: the operator's
    ``EVALQ_STORE``, or ``store``) and its spec in Redis; returns the job id. Without a store the
    instances go to the job's Redis list.

    With a given ``job_id`` (a redelivered request) whatever an earlier attempt
    left half-stored is replaced first.
    """
    import redis

    from evalq.shared.store import instances as staged, ledger
    from evalq.shared.store.place import job_place, store_root

    job_id = job_id or new_job_id()
    stored = StoredJob(spec, job_id)
    ttl = stored.ttl
    root = store_root() if store is FROM_ENV else store
    version = dataset_version(job, spec)
    if version is not None:  # kept beside the instances (the store) or in Redis: the history reads it
        spec["dataset_version"] = {**version.head(), "table": "store" if root is not None else "redis"}
    shared: dict[str, str] = {}
    place = running = None
    if root is not None:
        # the tenant's part of the store: the request queue's tenant, else the one the job names
        place = job_place(root, job_id, stored.store_tenant, stored.suite)
        try:
            kept = staged.stage(place, json_lines(job.instances, shared))
            if version is not None:
                place.put(TABLE_FILE, version.table)
            if staged.stage_shared(place, shared):  # what the instances share, beside them: none of it in Redis
                kept["shared"] = True
                shared = {}
            spec["instances"] = kept
            spec["records"] = PARTS  # and the item records as parts beside them (evalq.shared.store.records)
            # and the job itself, so that a cluster whose Redis lost it rebuilds it (evalq.shared.store.ledger)
            running = ledger.running_place(root)
            spec["running"] = running.as_json()
            ledger.keep(place, running, job_id, StoredJob(spec).to_json(), stored.binding)
        except Exception:
            _unstage(place, running, job_id, stored.binding)  # nothing half-staged is left behind
            raise
    try:
        if r.exists(keys.instances(job_id)):
            r.delete(keys.instances(job_id), keys.shared_values(job_id))
        pipe = r.pipeline(transaction=False)
        if root is None:
            ikey = keys.instances(job_id)
            for batch in _batches(json_lines(job.instances, shared), PUSH_BATCH):
                pipe.rpush(ikey, *batch)
                pipe.execute()
            pipe.expire(ikey, ttl)
        if version is not None and root is None:
            pipe.set(keys.dataset_version(job_id), version.table, ex=ttl)
        if shared:  # the values the instances refer to (evalq.shared.data.instances.SHARED_FIELDS)
            pipe.hset(keys.shared_values(job_id), mapping=shared)
            pipe.expire(keys.shared_values(job_id), ttl)
        # the spec last: a job with a spec has all its instances
        store_document(pipe, job_id, spec, ttl)
        pipe.set(keys.status(job_id), Status.RUNNING, ex=ttl)
        pipe.zadd(keys.JOBS, {job_id: time.time()})
        pipe.execute()
    except redis.RedisError as exc:
        delete_job(r, job_id, [m.key for m in job.runs])
        _unstage(place, running, job_id, stored.binding)
        if "maxmemory" in str(exc) and root is None:
            raise InfraError(f"storing job {job_id} failed: Redis is full (its maxmemory) with the job's instances; "
                             f"a job store (EVALQ_STORE) keeps them out of Redis") from None
        raise InfraError(f"storing job {job_id} failed: {exc}") from None
    return job_id


def dataset_version(job: Job, spec: dict):
    """The job's dataset version (``evalq.shared.data.versions``), its table of the instances the
    history keeps values of (``evalq.results.recording.sample_rate``); None for a job read without one."""
    from evalq.results.recording import sample_rate

    counted = getattr(job, "versions", None)
    if counted is None or not len(counted.ids):
        return None
    return counted.version(sample_rate(spec))


def _unstage(place: Place | None, running: Place | None, job_id: str, binding: str | None = None) -> None:
    """Remove what a submission that failed staged in the store: its markers first, then its folder."""
    import contextlib

    from evalq.shared.store.ledger import ended
    from evalq.shared.store.place import StoreUnavailable

    with contextlib.suppress(StoreUnavailable):
        if running is not None:
            ended(running.as_json(), job_id, binding)
        if place is not None:
            place.delete()


def _batches(items: Iterable[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def start(r: redis.Redis, broker_url: str, job_id: str, spec: "StoredJob | dict") -> None:
    """Send the job's first stage; the cluster does the rest."""
    spec = as_stored(spec, job_id)
    import redis

    from evalq.orchestrator.app import client_app
    from evalq.orchestrator.stages import send_stage

    stage = GENERATE_STAGE if has_model_stage(spec) else METRICS_STAGE
    try:
        send_stage(client_app(broker_url), r, job_id, spec, stage)
    except (redis.RedisError, OSError) as exc:
        raise InfraError(f"submitting job {job_id} failed: {exc}") from None


def submit(r: redis.Redis, broker_url: str, job: Job, chunk_size: int | None = None,
           out: Destination | str | None = None,
           request_id: str | None = None, reply_to: str | None = None, job_id: str | None = None,
           store: Place | None | object = FROM_ENV) -> str:
    """Store and start a job; returns its id at once."""
    from evalq.orchestrator.once import only_unscored

    job_id = job_id or new_job_id()
    only_unscored(r, job, job_id)  # a trace dataset: the spans no earlier run of the suite took
    spec = job_spec(job, chunk_size, out, request_id, reply_to)
    job_id = store_job(r, job, spec, job_id, store)
    start(r, broker_url, job_id, spec)
    return job_id


def delete_job(r: redis.Redis, job_id: str, metric_keys: list[str]) -> None:
    import redis

    try:
        r.delete(*keys.all_job_keys(job_id, metric_keys))
        r.zrem(keys.JOBS, job_id)
    except redis.RedisError:
        pass


def summaries(r: redis.Redis, job_id: str) -> tuple[list[dict], dict | None]:
    """(results.json content, the generation stage's summary or None)."""
    stage = r.get(keys.stage_summary(job_id, GENERATE))
    return json.loads(r.get(keys.summary(job_id))), (json.loads(stage) if stage else None)
