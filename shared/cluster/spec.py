"""A job's runs as its stored document holds them, read one way: its runs per stage, the instance
positions each covers, its chunks and the queues they go to (the document itself, and everything
else it says, is ``evalq.shared.job.stored.StoredJob``'s: these take one, or the outline of a job
not yet submitted, as a mapping). The orchestrator plans and looks after stages with it, workers
find their entry with it, the client shows progress with it; queue names are made here and
nowhere else (a job's ``MetricRun`` asks ``queue_of`` too).

The spec (``evalq.orchestrator.submit.job_spec``) is a JSON object: ``metrics`` (metric
key -> entry: ``id``, ``parameters``, ``chunk_size``, ``queue``, ``regions`` for judge
runs, ``span`` when not every instance; ``companions`` and ``led_by`` for entries scored
together, below), ``generate`` (the model under test's stage, when it runs), ``n_instances``
and what the outputs say of the job.

Entries scored together: cpu and gpu entries of the metrics stage that go to the same queue
over the same instances in chunks of the same size are planned as one run. The first of them
(its leader) lists the others under ``companions``, each of which names it under ``led_by``;
the plan sends the leader's chunks only, and a worker that takes one reads and decodes its
instances once and scores every entry of the group on them. Each entry still records its own
items, parts and timings, and its chunk still counts on its own towards the stage's total
(``chunk_ids``), so progress, outputs and resume read the same as for entries run alone.
"""

from __future__ import annotations

import math
from typing import Iterator, NamedTuple

from evalq.shared.cluster.status import Status

GENERATE = "generate"  # the generation stage's run key (and metric id)
GENERATE_STAGE, METRICS_STAGE = "generate", "metrics"
# A metric entry whose items need the model under test called on variants of an instance
# (perturbed inputs, repeats, a pair of sentences) has a run in the generation stage too, keyed
# ``<metric key>/variants``; its spec entry is ``spec["variants"][<metric key>]``.
VARIANTS = "/variants"


def variants_key(metric_key: str) -> str:
    return metric_key + VARIANTS


def is_variants(key: str) -> bool:
    return key.endswith(VARIANTS)


def variants_of(key: str) -> str:
    """The metric key a variants run serves."""
    return key.removesuffix(VARIANTS)


def is_model_run(key: str) -> bool:
    """A run whose items are the model under test's answers: generation, or an entry's variants."""
    return key == GENERATE or is_variants(key)


def has_model_stage(spec: dict) -> bool:
    """Whether the job starts with the generation stage (outputs to generate, or variants)."""
    return GENERATE in spec or bool(spec.get("variants"))


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
    return GENERATE_STAGE if is_model_run(metric_key) else METRICS_STAGE


def runs(spec: dict) -> list[tuple[str, dict]]:
    """(run key, spec entry) of every run, in stage order: generation first."""
    return stage_runs(spec, GENERATE_STAGE) + stage_runs(spec, METRICS_STAGE)


def stage_runs(spec: dict, stage: str) -> list[tuple[str, dict]]:
    """(metric key, spec entry) of each run of a stage, in job order."""
    if stage == GENERATE_STAGE:
        return ([(GENERATE, spec[GENERATE])] if GENERATE in spec else []) + \
            [(variants_key(key), entry) for key, entry in (spec.get("variants") or {}).items()]
    return list(spec["metrics"].items())


def entry_of(spec: dict, key: str) -> dict:
    """The spec entry of any run by its key."""
    if key == GENERATE:
        return spec[GENERATE]
    if is_variants(key):
        return spec["variants"][variants_of(key)]
    return spec["metrics"][key]


def span(spec: dict, entry: dict) -> int:
    """Instance positions (from the first) a run covers: all, unless a jailbreak's
    injected variants are for the safety metrics only."""
    return entry.get("span", spec["n_instances"])


def run_items(spec: dict, key: str, entry: dict) -> int:
    """Items a run records when complete (the generation stage: only those without an output)."""
    return entry["n_items"] if key == GENERATE else span(spec, entry)


def run_keys(spec: dict) -> list[str]:
    """Every run's key, in stage order: the generation stage's, then the metric entries'."""
    return [key for key, _ in runs(spec)]


def job_queues(spec: dict) -> set[str]:
    """Every queue the job's chunks may go to."""
    return {q for _, entry in runs(spec) for q in entry_queues(entry)}


def current_stage(spec: dict, status: str) -> str:
    """The stage a running job is in: generation, until its callback marks the job ``generated``."""
    return GENERATE_STAGE if has_model_stage(spec) and status != Status.GENERATED else METRICS_STAGE


def entry_chunks(spec: dict, entry: dict) -> int:
    """How many chunks a run is planned in."""
    return math.ceil(span(spec, entry) / entry["chunk_size"])


def stage_total(spec: dict, stage: str) -> int:
    return sum(entry_chunks(spec, entry) for _, entry in stage_runs(spec, stage))


def stage_items(spec: dict, stage: str) -> int:
    """Items the stage records when complete (the generation stage: only those without an output)."""
    return sum(run_items(spec, key, entry) for key, entry in stage_runs(spec, stage))


def companions(entry: dict) -> list[str]:
    """The keys of the entries a leader's chunks also score (none for an entry run alone)."""
    return list(entry.get("companions") or ())


def chunk_ids(spec: dict, metric_key: str, start: int) -> list[str]:
    """The chunk ids a finished chunk completes: its own, then its companions' at the same start."""
    try:
        carried = companions(entry_of(spec, metric_key))
    except KeyError:
        carried = []
    return [f"{key}:{start}" for key in carried] + [f"{metric_key}:{start}"]


def plan(spec: dict, stage: str) -> Iterator[Chunk]:
    """The stage's chunks, lazily and always in the same order. An entry scored with its
    leader (``led_by``) has no chunks of its own.

    A run with ``regions`` (judge metrics, an endpoint model) spreads its chunks
    over its deployments in proportion to their TPM (smooth weighted round
    robin, one rotation per judge shared by all its metrics); at run time a
    worker still moves calls to a deployment with spare budget.
    """
    rotations: dict[str, Iterator[str]] = {}
    for key, entry in stage_runs(spec, stage):
        if entry.get("led_by"):
            continue
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
