"""What a task does around a pure item function: read the chunk's instances
from Redis, score each item (a failure is recorded on that item), and write
item records idempotently. The same path runs metrics and the generation
stage (the model under test answering prompts); aggregation is in
``evalq.orchestrator.finalize``. An item that cost a model call is kept the moment
it is scored (``evalq.workers.keeping``), so a chunk run again pays only for
calls that were in flight."""

from __future__ import annotations

import gc
import json
import logging
import time
from typing import Any

import redis

from evalq.shared.cluster import journal, keys, telemetry
from evalq.shared.scores.aggregate import chunk_part
from evalq.shared.core.errors import Deferred, MetricError, Skipped
from evalq.shared.model.runners import GENERATE
from evalq.shared.metrics.registry import MetricSpec
from evalq.workers import keeping, prefetch, threads
from evalq.shared.cluster.spec import companions, variants_key
from evalq.shared.cluster.status import Status, status_of
from evalq.shared.core.jsonio import decode_many
from evalq.shared.core.memo import shared_reading
from evalq.workers.context import ChunkContext
from evalq.workers.judge import retiring

log = logging.getLogger("evalq.worker")

from evalq.workers.scoring import NOT_GENERATED, REDIS_BLIPS, Parked, score_items  # noqa: F401


def endpoint_client(ctx: ChunkContext, deployment: str | None, keeper: keeping.ItemKeeper | None = None):
    """What a judge metric or the generation stage calls: a JudgeClient, or a ModelRunner."""
    from evalq.shared.model.runners import PythonModel
    from evalq.workers.judge.client import JudgeClient

    try:
        config, options = ctx.endpoint
    except ValueError as exc:  # the operator's catalogue or inline policy refuses it: each item says why
        refused = Refused(str(exc))
        if ctx.model_run:
            from evalq.workers.generate import EndpointRunner

            return EndpointRunner(refused, None)
        return refused
    if isinstance(config, PythonModel):
        from evalq.workers.generate import python_runner

        return python_runner(config)
    client = JudgeClient(ctx.r, ctx.job_id, ctx.key, ctx.endpoint_name, config, options,
                         preferred=deployment,
                         memo=ctx.memo, keeper=keeper, tenant=ctx.tenant, ttl=ctx.ttl)
    retiring.look(ctx.r, config)  # when its model retires, as its provider says (twice a day, before a first call)
    if not ctx.model_run:  # what the entry asks its judge, as a digest: part of its judge identity
        from evalq.workers.judge.identity import note_prompt

        note_prompt(ctx.r, ctx.job_id, ctx.key, ctx.metric, ctx.params, config, ctx.ttl)
    client.batch = batch_lines(ctx, config, options, client.deployments)
    if not ctx.model_run and getattr(ctx.params, "panel", None):
        return panel_client(ctx, deployment, keeper, options, client)
    if ctx.model_run:
        from evalq.workers.generate import EndpointRunner

        return EndpointRunner(client, config.system)
    return client


def panel_client(ctx: ChunkContext, deployment: str | None, keeper: Any, options: Any, first: Any) -> Any:
    """A panel's members' clients (``evalq.workers.judge.panel``): the first member's is ``first``; a
    member the operator's catalogue or inline policy refuses answers every item with why."""
    from evalq.workers.judge.client import JudgeClient
    from evalq.workers.judge.panel import Panel

    members = {ctx.params.judge: first}
    for name in ctx.params.panel:
        if name in members:
            continue
        try:
            config = ctx.job.endpoint(name, ctx.job_id)
        except ValueError as exc:
            members[name] = Refused(str(exc))
            continue
        member = JudgeClient(ctx.r, ctx.job_id, ctx.key, name, config, options, preferred=deployment,
                             memo=ctx.memo, keeper=keeper, tenant=ctx.tenant, ttl=ctx.ttl)
        retiring.look(ctx.r, config)
        member.batch = batch_lines(ctx, config, options, member.deployments, name)  # its lines: its judge's
        members[name] = member
    return Panel({name: members[name] for name in ctx.params.panel}, ctx.params.panel_aggregate,
                 ctx.params.panel_quorum)


class Refused:
    """What a judge or model the operator's catalogue or inline policy refuses answers: every
    call, an item error saying why; nothing is sent."""

    def __init__(self, reason: str):
        self.reason = reason

    def complete(self, *_args, **_kwargs):
        from evalq.workers.judge.client import JudgeError

        raise JudgeError(f"not sent: {self.reason}")


def batch_lines(ctx: ChunkContext, config: Any, options: Any, deployments: list, name: str | None = None) -> Any:
    """The entry's ``BatchLines`` when its calls go through the Batch API (its ``mode``, else
    ``judging.mode``; generation follows ``judging.mode`` where the model has a batch
    deployment), else None. ``auto`` carries its deadline."""
    from evalq.workers.judge.batch_lines import BatchLines

    mode = options.mode if ctx.model_run else ctx.params.effective_mode(options)
    if mode == "sync" or not config.batch_deployments:
        return None
    deadline = ctx.job.auto_deadline if mode == "auto" else None
    return BatchLines(ctx.r, ctx.job_id, ctx.key, name or ctx.endpoint_name, config, deployments, deadline, ttl=ctx.ttl)


_SETTLED: dict[str, int] = {}


def settle(spec: MetricSpec) -> None:
    """Import the metric, and on its first import in this process move everything alive into
    the collector's permanent generation (``gc.freeze``): the modules, models and tables a worker
    keeps for its life are then never scanned again, where every chunk's thousands of decoded
    instances would otherwise have the cyclic collector walk them all, over and over (a third of
    a trajectory chunk's time). Once more as the metric's second chunk starts: a model metric
    loads its model in its first chunk (or a preloading thread does, beside it), after the first
    freeze, and each full collection then walked the model's objects (about 90 ms a time for the
    toxicity classifier in a worker, once in a job's first chunk; measured)."""
    spec.load()
    seen = _SETTLED.get(spec.impl, 0)
    if seen < 2:
        _SETTLED[spec.impl] = seen + 1
        gc.freeze()


def run_chunk(r: redis.Redis, job_id: str, metric_key: str, start: int, stop: int,
              deployment: str | None = None, queue: str | None = None) -> dict:
    ctx = ChunkContext.read(r, job_id, metric_key)  # the job's context, read once for the whole chunk
    carried = companions(ctx.entry)
    if carried:
        return _run_together(ctx, [ChunkContext.read(r, job_id, key) for key in carried], start, stop, queue)
    spec, params = ctx.metric, ctx.params
    settle(spec)  # imports stay out of the timing below
    positions = list(range(start, stop))
    kept: dict[int, dict] = {}
    if spec.calls_endpoint:
        # A re-scheduled or redelivered chunk pays for no item already recorded
        # or kept, nor again for a call of an item that was answered.
        recorded, kept = keeping.earlier(r, ctx.records, job_id, metric_key, positions)
        positions = [p for p in positions if p not in recorded and "record" not in kept.get(p, {})]
    if metric_key == GENERATE:  # only instances without an output are generated
        instances = _instances(ctx, positions)
        wanted = [(p, inst) for p, inst in zip(positions, instances) if "actual-output" not in inst]
        positions, instances = [p for p, _ in wanted], [inst for _, inst in wanted]
    else:
        instances = _read_ahead(ctx, start, stop, queue, positions)
    keeper = judge = None
    if spec.calls_endpoint:
        keeper = keeping.ItemKeeper(r, job_id, metric_key, positions,
                                    {p: k["replies"] for p, k in kept.items() if "replies" in k}, ctx.ttl,
                                    chunk=journal.chunk_id(metric_key, start),
                                    accounts={p: k["acct"] for p, k in kept.items() if "acct" in k}, kept=kept)
        judge = endpoint_client(ctx, deployment, keeper)
        if ctx.variants_run:  # the model asked through the job's prompt template
            from evalq.shared.model.runners import PromptedModel

            judge = PromptedModel(judge, ctx.entry["prompt_template"])
    t0 = time.perf_counter()
    try:
        with threads.counting() as cpu:  # its CPU seconds, where its items wait on calls
            records = score_items(spec, params, instances, ctx.prepared, judge, ctx.human, keeper,
                                  stop=(lambda: status_of(r, job_id) in (Status.CANCELLED, "")) if keeper else None)
    except BaseException as exc:
        closing = _close(keeper)
        if isinstance(exc, (Deferred, Parked)):  # its items are kept
            _write(ctx, start, {}, time.perf_counter() - t0, extra=closing, compute=_compute(cpu, keeper))
        elif closing:  # what the calls of a run cut short counted
            keeping.WRITE_BEHIND.write(r, closing)
        raise
    closing = _close(keeper)
    elapsed = time.perf_counter() - t0
    # (a record None: the chunk was stopped, its job cancelled, before that item started)
    new = {p: k["record"] for p, k in kept.items() if "record" in k} | \
        {p: rec for p, rec in zip(positions, records) if rec is not None}
    acct = None
    if keeper is not None:  # what its calls counted rides in its part (an earlier landing's with it)
        acct = ctx.records.accounting(metric_key, start, keeper.chunk_accounting(kept), bool(recorded), r)
    _record_chunk(ctx, start, stop, new, elapsed, queue, kept=range(start, stop) if spec.calls_endpoint else range(0),
                  acct=acct, extra=closing, compute=_compute(cpu, keeper))
    # A small, deterministic summary: a redelivered run returns the very same one.
    if None in records:
        return {"metric": metric_key, "start": start, "n": len(new), "stopped": True}
    return {"metric": metric_key, "start": start, "n": stop - start}


def _compute(cpu: threads.Cpu, keeper: keeping.ItemKeeper | None) -> float | None:
    """The run's CPU seconds where its items wait on calls (a judge's, a model's); None elsewhere (all
    of a chunk's time is then its work)."""
    return cpu.seconds() if keeper is not None else None


def _close(keeper: keeping.ItemKeeper | None) -> list:
    """What waits in the run's keeper is written; what its calls add to the accounting, to ride the
    chunk's transaction."""
    if keeper is None:
        return []
    keeper.flush()  # the counters of an item cut short
    return keeper.closing()


def _run_together(leader: ChunkContext, others: list[ChunkContext], start: int, stop: int,
                  queue: str | None) -> dict:
    """A chunk of entries scored together (``evalq.shared.cluster.spec``): the instances are read
    and decoded once, and each entry scores them in turn, inside one ``shared_reading`` (what its
    metrics derive from an instance, derived once) and records its own items, part and timing.
    An entry whose scoring fails outright does not stop the others; the chunk then fails after
    them (the worker counts it finished, as it counts any chunk given up)."""
    contexts = [*others, leader]  # the leader last, like its chunk id
    for ctx in contexts:
        settle(ctx.metric)
    positions = list(range(start, stop))
    instances = _read_ahead(leader, start, stop, queue, positions)
    failed: Exception | None = None
    with shared_reading():
        for ctx in contexts:
            t0 = time.perf_counter()
            try:
                records = score_items(ctx.metric, ctx.params, instances, ctx.prepared, None, ctx.human)
                _record_chunk(ctx, start, stop, dict(zip(positions, records)), time.perf_counter() - t0, queue)
            except (Deferred, *REDIS_BLIPS):
                raise  # the whole chunk goes again: what was recorded is recorded again, the same
            except Exception as exc:
                log.exception("job %s %s[%d:%d] failed (scored with %s)", ctx.job_id, ctx.key, start, stop,
                              leader.key)
                failed = failed or exc
    if failed is not None:
        raise failed
    return {"metric": leader.key, "start": start, "n": stop - start, "with": [ctx.key for ctx in others]}


def _read_ahead(ctx: ChunkContext, start: int, stop: int, queue: str | None, positions: list[int]) -> list[dict]:
    """The chunk's instances; on the gpu queue, read ahead by the last chunk, and the next one read
    while this one scores."""
    if queue == "gpu" and not ctx.metric.calls_endpoint:
        instances = prefetch.take(ctx.job_id, ctx.key, start, stop) or _entry_instances(ctx, positions)
        prefetch.ahead(ctx.job_id, ctx.key, stop, min(stop + ctx.entry["chunk_size"], ctx.span),
                       lambda ahead: _entry_instances(ctx, ahead))
        return instances
    return _entry_instances(ctx, positions)


def _record_chunk(ctx: ChunkContext, start: int, stop: int, new: dict[int, dict], elapsed: float,
                  queue: str | None, kept: range = range(0), acct: dict | None = None, extra: list = (),
                  compute: float | None = None) -> None:
    """Write what the chunk made of an entry: its new records, its aggregate part, and what
    report.html and the history store read of it; then send its scores to the job's sinks
    (``evalq.results.sinks``: OpenTelemetry evaluation events, Phoenix span annotations, MLflow
    assessments; a trace instance's record carries its ``otel`` ids, the span they attach to)."""
    spec = ctx.metric
    items = _chunk_records(ctx, start, stop, dict(new))
    dumped = ctx.params.model_dump(mode="json")
    part = chunk_part(spec.aggregation, dumped, [rec for _, rec in items])
    view = values = None
    if not ctx.model_run:  # what report.html and the history store need of the chunk, so the
        from evalq.results.recording import chunk_values  # final callback parses no record
        from evalq.results.report import chunk_view
        from evalq.shared.scores.results import read

        readings = [read(spec.aggregation, dumped, record) for _, record in items]  # each record read once
        view = chunk_view(items, readings, ctx.span, start)
        values = chunk_values(items, readings)
    _write(ctx, start, new, elapsed, part, view, values, kept=kept, whole=items, acct=acct, extra=extra,
           compute=compute)
    # every record in ``new`` was recorded just now (one kept by a deferred run of the
    # chunk was never written there), so each item counts once, as results.json counts it
    telemetry.items_recorded(spec.id, queue, new.values())
    if not ctx.model_run:  # to the job's sinks: OTLP, Phoenix, MLflow, where the operator configured them
        from evalq.results.sinks import export_chunk

        export_chunk(ctx.r, ctx.job_id, ctx.job, ctx.key, ctx.entry, spec.aggregation, items)


def _entry_instances(ctx: ChunkContext, positions: list[int]) -> list[dict]:
    """The entry's instances at ``positions``, with what the generation stage and the variants
    runs recorded for them where the entry reads it."""
    instances = _instances(ctx, positions)
    if ctx.needs_generated:
        _with_generated(ctx, positions, instances)
    if ctx.needs_variants:
        _with_variants(ctx, positions, instances)
    return instances


def _instances(ctx: ChunkContext, positions: list[int]) -> list[dict]:
    if not positions:
        return []
    lo, hi = positions[0], positions[-1]
    raw = ctx.instances.lines(ctx.r, lo, hi + 1)
    picked = raw if len(raw) == len(positions) else [raw[p - lo] for p in positions]
    return ctx.instances.with_shared(ctx.r, decode_many(picked))


def _with_generated(ctx: ChunkContext, positions: list[int], instances: list[dict]) -> None:
    """Give instances without an output the one the generation stage recorded."""
    wanted = [(p, inst) for p, inst in zip(positions, instances) if "actual-output" not in inst]
    if not wanted:
        return
    raw = ctx.records.get_many(ctx.r, GENERATE, [p for p, _ in wanted], complete=True)
    for (_, inst), rec in zip(wanted, raw):
        record = json.loads(rec) if rec is not None else {"error": "no output was recorded"}
        if "result" in record:
            inst["actual-output"] = record["result"]["output"]
        elif record.get("skipped") is not None:
            inst[NOT_GENERATED] = Skipped(f"not generated: {record['skipped']}")
        else:
            inst[NOT_GENERATED] = MetricError(f"the model under test gave no output: {record.get('error')}")


def _with_variants(ctx: ChunkContext, positions: list[int], instances: list[dict]) -> None:
    """Give each instance what the model answered to its variants (``variants``), recorded by the
    entry's variants run; one without them is recorded with the reason instead."""
    if not positions:
        return
    raw = ctx.records.get_many(ctx.r, variants_key(ctx.key), positions, complete=True)
    for inst, rec in zip(instances, raw):
        record = json.loads(rec) if rec is not None else {"error": "nothing was recorded"}
        if "result" in record:
            inst["variants"] = record["result"]
        elif inst.get(NOT_GENERATED) is None:
            inst[NOT_GENERATED] = MetricError(f"the model under test did not answer the variants: "
                                              f"{record.get('error') or record.get('skipped')}")


def _chunk_records(ctx: ChunkContext, start: int, stop: int, new: dict[int, dict]) -> list[tuple[int, dict]]:
    """(position, record) of every record of the chunk: those just made, and those
    an earlier (deferred or redelivered) run of it recorded. Positions with
    nothing to record (the generation stage's, for instances that had an output)
    are left out."""
    earlier = [p for p in range(start, stop) if p not in new]
    if earlier:
        for p, raw in zip(earlier, ctx.records.get_many(ctx.r, ctx.key, earlier)):
            if raw is not None:
                new[p] = json.loads(raw)
    return [(p, new[p]) for p in sorted(new)]


def _write(ctx: ChunkContext, start: int, records: dict[int, dict], elapsed: float, part: dict | None = None,
           view: dict | None = None, values: dict | None = None, kept: range = range(0),
           whole: list[tuple[int, dict]] | None = None, acct: dict | None = None, extra: list = (),
           compute: float | None = None) -> None:
    """``records``: those this run made; ``whole``: every record of the chunk, once it has ended
    (``evalq.shared.store.records`` writes them to ``res:{M}`` or as the chunk's part); ``extra``:
    more ops for the same transaction (what the run's calls add to the accounting); ``elapsed`` and
    ``compute``: the run's seconds, and of those its CPU's (measured where its items wait on calls)."""
    job_id, metric_key = ctx.job_id, ctx.key
    pipe = ctx.r.pipeline(transaction=True)
    # the records, and the history's values and the report's view (with a job store they ride in the
    # chunk's part, not in Redis: what Redis keeps of a job does not grow with its items)
    timing = {"seconds": elapsed} if compute is None else {"seconds": elapsed, "compute": compute}
    ctx.records.write(pipe, metric_key, start, records, whole, values, view, part, timing, acct, ctx.ttl)
    if kept:  # the chunk's records are written: what was kept of its items goes
        pipe.hdel(keys.kept(job_id, metric_key), *(str(p) for p in kept))
    if part is not None:  # likewise by chunk
        pipe.hset(keys.parts(job_id, metric_key), str(start), json.dumps(part))
    pipe.hincrbyfloat(keys.timings(job_id, metric_key), str(start), elapsed)
    if compute is not None:
        pipe.hincrbyfloat(keys.timings(job_id, metric_key), f"{keys.COMPUTE}{start}", compute)
    for method, args in extra:
        getattr(pipe, method)(*args)
    pipe.execute()
    if whole is not None:  # (a judge entry's part of a group of chunks: written by the chunk that completes it)
        ctx.records.landed(ctx.r, metric_key, start)
