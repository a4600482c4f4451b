"""The one registry of metrics, keyed by the id used in job files.

A ``MetricSpec`` carries everything about a metric: its typed parameter model,
where its pure implementation lives (a lazy ``"module:attr"`` path, so the CLI
never imports NLTK or torch), which queue kind runs it, which instance fields it
needs and how its per-item results aggregate. Adding a metric is one function,
one parameter model, one entry in ``evalq.shared.metrics.builtin`` and one test file.
"""

from __future__ import annotations

import difflib
import importlib
import math
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from pydantic import BaseModel

QueueKind = Literal["cpu", "gpu", "judge", "generate"]
Aggregation = Literal["mean", "distribution", "rating", "defect", "classification", "toxicity", "robustness"]


CHUNKS_PER_ENTRY = 100
CHUNK_MIN, CHUNK_MAX = 250, 1000
# A judge entry's items per chunk, where the job does not say: a sixteenth of its items (a judge
# worker's threads each take a chunk), at least the metric's own size and at most JUDGE_CHUNK. A large
# chunk's items are judged side by side (``evalq.workers.scoring``) and its records reach the job
# store as one part: a night of a million judged items writes a thousand parts, and a task's fixed
# costs (its message, its context, its records' transaction) are paid once per thousand calls, not
# once per four (issue 73); a small job still spreads over every worker thread.
JUDGE_CHUNK, JUDGE_SPREAD = 1024, 16


def judge_chunk(items: int, smallest: int | None) -> int:
    """Items per chunk of a judge entry of ``items`` (``smallest``: the metric's own chunk size)."""
    return max(1, min(JUDGE_CHUNK, max(smallest or 1, -(-items // JUDGE_SPREAD))))
# A cheap metric's chunks (``MetricSpec.item_us``) hold about CHEAP_CHUNK_S of its work, so that a
# task's fixed cost (its message and dispatch, the completion count, a few Redis round trips: about
# 8 ms a task on the CI kind, measured; BENCHMARKS.md) stays small beside it: at most CHEAP_CHUNK_MAX
# items, and never fewer than CHEAP_SPREAD tasks an entry, so that it still spreads over workers;
# nor more than CHEAP_CHUNK_BYTES of stored instances, so that a worker holds no more of long texts
# than a 1,000-item chunk of short ones.
CHEAP_CHUNK_S = 0.06
CHEAP_CHUNK_MAX = 10_000
CHEAP_SPREAD = 8
CHEAP_CHUNK_BYTES = 4 * 1024 * 1024


def device_chunk(items: int, smallest: int, largest: int) -> int:
    """A device metric's items per task: an eighth of the entry's items, rounded up to a multiple
    of ``smallest``, from ``smallest`` to ``largest`` (BENCHMARKS.md: the gpu queue)."""
    eighth = -(-items // 8)
    return max(smallest, min(largest, -(-eighth // smallest) * smallest))


def sized_chunk(items: int, item_us: float | None = None, item_bytes: float | None = None) -> int:
    """Items per task for a metric without a fixed size (the lexical cpu metrics):
    about CHUNKS_PER_ENTRY tasks per entry, each of 250 to 1,000 items. Small jobs
    keep small chunks, which spread over every worker process; large ones pay the
    per-task costs (a message, fetching instances, writing records) on 4x fewer
    tasks (measured: a 50k-instance run of three lexical metrics scored 8% faster
    with 1,000 than with 250 items per task; BENCHMARKS.md).

    ``item_us``: what an item costs, for metrics far cheaper than a task (exact_match's
    13 us against about 8 ms a task): their chunks hold about CHEAP_CHUNK_S of work
    instead, up to CHEAP_CHUNK_MAX items, while the entry keeps CHEAP_SPREAD tasks, and
    within CHEAP_CHUNK_BYTES of instances (``item_bytes``: an instance's stored size)."""
    size = min(CHUNK_MAX, max(CHUNK_MIN, -(-items // CHUNKS_PER_ENTRY)))
    if item_us:
        worth = min(CHEAP_CHUNK_MAX, math.ceil(CHEAP_CHUNK_S * 1e6 / item_us), -(-items // CHEAP_SPREAD))
        if item_bytes:
            worth = min(worth, int(CHEAP_CHUNK_BYTES // item_bytes))
        size = max(size, worth)
    return size


@dataclass(frozen=True)
class MetricSpec:
    id: str
    params: type[BaseModel]
    # "module:function". An item function is ``f(instance, params) -> result``;
    # a batch function (``batch=True``) is ``f(instances, params) -> [result | Exception]``.
    impl: str
    queue: QueueKind
    description: str
    aggregation: Aggregation = "mean"  # also says which way is better: lower for "defect", higher for the rest
    # the range every number of an item's result lies in (None: unbounded); a
    # mean's interval is clipped to it (ratings: their scale; 0/1 values: Wilson)
    bounds: tuple[float, float] | None = None
    # instance fields that must be present (and non-empty for expected-output)
    requires: tuple[str, ...] = ("actual-output",)
    batch: bool = False
    # default number of items one task carries; None: sized by the entry's items (sized_chunk)
    chunk_size: int | None = None
    # about what one item costs on one core, in microseconds, for a metric far cheaper than a
    # task's fixed cost (measured on the CI kind with bench/bench_fast_metrics.py's instances):
    # its chunks are sized by their work (sized_chunk). None: not cheap.
    item_us: float | None = None
    # a device metric's chunk sizes (smallest, largest): an eighth of the entry's items, a multiple of
    # the smallest, so that a chunk fills a GPU's batches and pays the per-chunk costs rarely, while
    # a large entry still spreads over several workers (overrides chunk_size)
    device_chunk: tuple[int, int] | None = None
    # Optional "module:function" run once per job by the orchestrator before
    # anything is enqueued: ``prepare(instances, params) -> JSON object`` (e.g.
    # idf statistics over all references). Its result is stored with the job and
    # passed to the implementation as a third argument.
    prepare: str | None = None
    # Judge metrics that make several calls per item: every reply is kept for the
    # job's lifetime, so a call made once (a text's claims, a re-run item's answered
    # calls) is never paid again, even with the cross-job cache off.
    memo: bool = False
    # The queue kind for an entry's parameters, when they decide it (a part that needs a model
    # on the gpu queue only when asked for); None: always ``queue``.
    queue_for: Callable[[Any], QueueKind] | None = None
    # Items that need the model under test called on variants of their instance (perturbed
    # inputs, repeats, two sentences' log-probabilities): "module:function" of the variants item
    # function, ``f(instance, params, model) -> result``, run in the generation stage on the
    # model's queue (``variants_spec``); the metric's own function then finds that result under
    # the instance's ``variants``. ``variants_chunk``: instances per variants task.
    variants: str | None = None
    variants_chunk: int = 2
    # A check of an entry's parameters against the job's model (``f(params, model) -> problem
    # or None``): e.g. a metric that needs log-probabilities refuses an endpoint model.
    model_check: Callable[[Any, Any], str | None] | None = None
    # Instance fields some parameter values need beside ``requires`` (f(params) -> fields).
    requires_for: Callable[[Any], tuple[str, ...]] | None = None
    # Which way a result field gets worse, where it is not the default (scores worse lower, defect
    # rates higher): (fnmatch pattern of field names, "higher" | "lower" | "neither"), first match wins.
    # History's regressions and its page read it (e.g. a word error rate is worse higher).
    worse: tuple[tuple[str, str], ...] = ()
    # Optional "module:function" ``f(params) -> str`` that loads into a worker process what the
    # entry's items need (a model, a tokenizer, the device's kernels) before a chunk asks for
    # them, and says what it loaded: a worker started with ``EVALQ_PRELOAD`` calls it at start.
    warm: str | None = None
    # A panel of judges may score it (``parameters.panel``; evalq.shared.judging.panel): one score
    # and a reason per item, which the members' scores combine into.
    panel: bool = False
    _loaded: list = field(default_factory=list, repr=False, compare=False)
    _variants: list = field(default_factory=list, repr=False, compare=False)

    @property
    def calls_endpoint(self) -> bool:
        """Items cost a model call: a re-run skips items already recorded."""
        return self.queue in ("judge", "generate")

    def kind(self, params: Any) -> QueueKind:
        """The queue kind an entry with these parameters runs on."""
        return self.queue_for(params) if self.queue_for is not None else self.queue

    def worse_direction(self, field: str) -> str | None:
        """The entry's own direction for a field (None: the default one)."""
        import fnmatch

        return next((way for pattern, way in self.worse if fnmatch.fnmatchcase(field, pattern)), None)

    def required(self, params: Any) -> tuple[str, ...]:
        """The instance fields an entry with these parameters needs."""
        more = self.requires_for(params) if self.requires_for is not None else ()
        return self.requires + tuple(f for f in more if f not in self.requires)

    @property
    def needs_references(self) -> bool:
        return "expected-output" in self.requires

    def load(self) -> Callable[..., Any]:
        """Import the implementation on first use (workers only)."""
        if not self._loaded:
            self._loaded.append(_import(self.impl))
        return self._loaded[0]

    def variants_spec(self) -> "MetricSpec":
        """The spec of this metric's variants run: its variants function as an item function
        on the model's queue, keeping what each call answered like generation does."""
        if not self._variants:
            self._variants.append(MetricSpec(
                id=self.id, params=self.params, impl=self.variants, queue="generate", chunk_size=self.variants_chunk,
                requires=("input",), description=f"variants of each instance for {self.id}"))
        return self._variants[0]

    def load_prepare(self) -> Callable[..., Any] | None:
        return _import(self.prepare) if self.prepare else None

    def load_warm(self) -> Callable[..., Any] | None:
        return _import(self.warm) if self.warm else None


def _import(path: str) -> Callable[..., Any]:
    module_name, _, attr = path.partition(":")
    return getattr(importlib.import_module(module_name), attr)


class UnknownMetric(KeyError):
    def __init__(self, metric_id: str, known: list[str]):
        close = difflib.get_close_matches(metric_id, known, n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        self.message = f"unknown metric {metric_id!r}{hint} Available: {', '.join(sorted(known))}"
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


# Names the log and the job spec use for stages that are not metrics.
RESERVED = {"generate"}


class Registry:
    """Thread-safe map from metric id to ``MetricSpec``; duplicate ids are refused."""

    def __init__(self) -> None:
        self._specs: dict[str, MetricSpec] = {}
        self._lock = threading.Lock()

    def register(self, spec: MetricSpec) -> MetricSpec:
        with self._lock:
            if spec.id in RESERVED:
                raise ValueError(f"metric id {spec.id!r} is reserved")
            if spec.id in self._specs:
                raise ValueError(f"metric {spec.id!r} is already registered")
            self._specs[spec.id] = spec
        return spec

    def get(self, metric_id: str) -> MetricSpec:
        try:
            return self._specs[metric_id]
        except KeyError:
            raise UnknownMetric(metric_id, list(self._specs)) from None

    def __contains__(self, metric_id: str) -> bool:
        return metric_id in self._specs

    def all(self) -> list[MetricSpec]:
        return sorted(self._specs.values(), key=lambda s: s.id)


REGISTRY = Registry()
