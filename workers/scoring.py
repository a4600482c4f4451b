"""Scoring a chunk's items: a pure item function per instance (a failure is recorded on that item),
or a batch function over them all. Items that each call a judge or a model are scored side by side:
one per 64 items of the chunk, up to ``EVALQ_CALLS_PER_CHUNK`` (default 16) at once, on the worker's
item threads (``evalq.workers.threads``), so that a chunk of a thousand judged items waits on its calls in parallel, as
sixteen chunks of a few items do on the worker's threads. The first item that defers the chunk (a budget spent, Redis away) stops the others
from starting; those in flight finish and are kept (``evalq.workers.keeping``)."""

from __future__ import annotations

import logging
import os
import threading
import time
import traceback
from typing import Any, Callable

import redis

from evalq.shared.core.errors import Deferred, NotApplicable, Pending, Skipped
from evalq.shared.metrics.registry import MetricSpec
from evalq.shared.store.place import StoreUnavailable
from evalq.workers.item_budget import bounded
from evalq.workers import threads
from evalq.workers.judge.panel import Panel

log = logging.getLogger("evalq.worker")

CALLS_ENV = "EVALQ_CALLS_PER_CHUNK"
CALLS = 16  # items of a chunk scored at once where each calls a judge or a model, at most ...
ITEMS_PER_CALL = 64  # ... one per this many items of the chunk
LOOK = 1.0  # seconds between two looks at whether the chunk should stop (its job cancelled)

# Raised by a judge client's Redis calls mid-item: not the item's fault.
# what a chunk task rides out (retried with backoff): Redis away, and the job store away
REDIS_BLIPS = (redis.ConnectionError, redis.TimeoutError, StoreUnavailable)

# An instance the generation stage could not answer carries, under this key,
# the outcome its metrics record instead of a score.
NOT_GENERATED = "__not_generated__"


class Parked(Exception):
    """Items of the chunk wait for provider batches (``digests``: their calls); the others
    are kept. The chunk is run again when the replies are back (``evalq.orchestrator.parking``)."""

    def __init__(self, digests: list[str]):
        self.digests = digests
        super().__init__(f"{len(digests)} call(s) wait for a batch")



def side_by_side(items: int) -> int:
    """How many of a chunk's ``items`` are scored at once where each calls a judge or a model: one per
    ``ITEMS_PER_CALL`` items of the chunk, up to ``EVALQ_CALLS_PER_CHUNK`` (a chunk of a few items
    goes in order, as its worker thread's share of the worker's calls)."""
    try:
        calls = int(os.environ.get(CALLS_ENV, CALLS))
    except ValueError:
        calls = CALLS
    return max(1, min(calls, -(-items // ITEMS_PER_CALL)))


def _each(one: Callable[[int], None], indices: list[int], width: int, stop: Callable[[], bool] | None) -> bool:
    """``one(i)`` for each index, ``width`` at a time; the first exception stops the indices not yet
    started, and is raised once those in flight are done. ``stop`` (asked once a ``LOOK``) true: the
    indices not yet started are left; False then."""
    halt, raised, lock = threading.Event(), [], threading.Lock()
    looked, stopped = [time.monotonic()], [False]

    def guarded(i: int) -> None:
        if halt.is_set():
            return
        if stop is not None and time.monotonic() - looked[0] > LOOK:
            looked[0] = time.monotonic()
            if stop():
                stopped[0] = True
                halt.set()
                return
        try:
            one(i)
        except BaseException as exc:  # noqa: BLE001  (raised below, after the items in flight)
            with lock:
                raised.append(exc)
            halt.set()

    if width <= 1:
        for i in indices:
            guarded(i)
            if halt.is_set():
                break
    else:
        threads.side_by_side(guarded, indices, width)
    if raised:
        raise raised[0]
    return not stopped[0]


def score_items(spec: MetricSpec, params: Any, instances: list[dict], prepared: Any = None,
                judge: Any = None, human: str | None = None,
                keeper: Any = None, stop: Callable[[], bool] | None = None) -> list[dict | None]:
    """Score instances; an exception becomes an ``error`` on that item only.

    Metrics with a ``prepare`` hook get its result, judge metrics a judge
    client, as further arguments. ``Deferred`` propagates (the task
    re-schedules), and so does a Redis connection error (a judge client's
    budget call, say); ``Skipped`` marks the item as not run. An instance
    marked ``NOT_GENERATED`` is recorded with that outcome and not scored. An item
    whose judge call waits for a provider batch (``Pending``) gets no record; once
    every item was asked, ``Parked`` says which calls the chunk waits for.
    Records carry the instance's grade for ``human`` (``human.<key>``); a
    ``keeper`` gets each item's record as soon as the item is scored. Items that call a judge or a
    model are scored side by side (``side_by_side``), and ``stop`` (asked once a second: its job
    was cancelled) ends the chunk early: the items never started are None.
    """
    needs = spec.required(params)
    # read, not taken: the entries of a chunk scored together read the same instances
    outcomes: list = [inst.get(NOT_GENERATED) or _lacking(needs, inst) for inst in instances]
    ready = [i for i, outcome in enumerate(outcomes) if outcome is None]
    records: list[dict | None] = [None] * len(instances)
    waiting: set[str] = set()
    unstarted: set[int] = set()
    with bounded(spec, spec.load()) as fn:  # EVALQ_ITEM_TIMEOUT per item (evalq.workers.item_budget)
        extra = ((prepared,) if spec.prepare else ()) + ((judge,) if spec.calls_endpoint else ())
        if spec.batch:
            try:
                results = fn([instances[i] for i in ready], params, *extra) if ready else []
            except Exception as exc:  # the whole batch failed: record it on each item
                results = [exc] * len(ready)
            for i, result in zip(ready, results):
                outcomes[i] = result
        else:
            def one(i: int) -> None:
                if keeper is not None:
                    keeper.begin(i)
                try:
                    outcomes[i] = (judge.score(fn, instances[i], params) if isinstance(judge, Panel)
                                   else fn(instances[i], params, *extra))
                except (Deferred, *REDIS_BLIPS):
                    raise  # not the item's fault: the task re-schedules, or is retried
                except Pending as exc:  # a call waits for a provider batch: the item is asked again later
                    waiting.update(exc.digests)
                    return
                except Exception as exc:
                    outcomes[i] = exc
                if keeper is not None:
                    records[i] = _record(spec, instances[i], outcomes[i], human)
                    keeper.done(records[i])

            if not _each(one, ready, side_by_side(len(ready)) if judge is not None else 1, stop):
                # (the keeper has the record of every item that ended; one waiting for a batch has none)
                unstarted = {i for i in ready if records[i] is None}
    if unstarted:  # the chunk was stopped: what was scored is recorded, the rest never started
        return [None if i in unstarted else record if record is not None else _record(spec, inst, outcome, human)
                for i, (record, inst, outcome) in enumerate(zip(records, instances, outcomes))]
    if waiting:
        raise Parked(sorted(waiting))
    return [record if record is not None else _record(spec, inst, outcome, human)
            for record, inst, outcome in zip(records, instances, outcomes)]


def _lacking(needs: tuple[str, ...], inst: dict) -> NotApplicable | None:
    """An instance without a field the entry reads: only a trace dataset's (a model call has no
    ``messages``, an agent's run may have no text answer); every other dataset is checked whole
    before it is stored."""
    if "otel" not in inst:  # not a trace dataset's: checked at submission
        return None
    missing = next((f for f in needs if f not in inst), None)
    return NotApplicable(f"the span has no {missing!r}") if missing is not None else None


def _record(spec: MetricSpec, inst: dict, outcome: Any, human: str | None) -> dict:
    # instance_id first: the final callback splices log lines after it (evalq.results.outputs)
    record: dict[str, Any] = {"instance_id": inst["id"]}
    if isinstance(inst.get("category"), str):
        record["category"] = inst["category"]
    if inst.get("variant") is not None:
        record["variant"] = inst["variant"]
    if isinstance(inst.get("otel"), dict):  # a trace's instance: its ids join the line back to its span
        record["otel"] = inst["otel"]
    if isinstance(outcome, Skipped):
        record["skipped"] = str(outcome)
    elif isinstance(outcome, NotApplicable):
        record["not_applicable"] = str(outcome)
    elif isinstance(outcome, Exception):
        record["error"] = f"{type(outcome).__name__}: {outcome}"
        log.warning("item %r of %s failed: %s", inst["id"], spec.id,
                    "".join(traceback.format_exception_only(outcome)).strip())
    else:
        record["result"] = outcome
    grades = inst.get("human")
    if human is not None and isinstance(grades, dict) and human in grades:
        record["human"] = grades[human]
    return record


