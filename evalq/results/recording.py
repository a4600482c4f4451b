"""The final callback's last step: record the ended job in the history store, judge its
regressions against the suite's past, and send the alert (``evalq.results.alerts``).

A run's series come from what the callback already has: results.json's content for each
entry's value and interval, and the per-instance values that pair runs by instance id,
which the worker that scored each chunk kept beside its records (``chunk_values``), so
the callback parses no item record (it reads the records only for an entry some chunk of
which left no values: a chunk given up, a cancelled job). The values are read a chunk at a time:
each series' n, mean and standard deviation are over every item, and its per-instance values,
for pairing, are those of about ``EVALQ_HISTORY_MAX_ITEMS`` instances (default 100,000): all of
an entry that small, else a sample chosen by a hash of the instance id (``in_sample``), the
same instances in every run of any size, so that a bigger night is still paired with its
baseline and the callback's memory does not grow with N.
Recording never fails the job: an unreachable database is logged, and the outputs stand.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass

import redis

from evalq.shared.cluster import keys
from evalq.results.history_tables import REGRESSION_FIELDS
from evalq.shared.core.config import env_number
from evalq.shared.core.jsonio import pack_floats, unpack_floats
from evalq.shared.model.runners import GENERATE
from evalq.shared.job.stored import StoredJob, as_stored
from evalq.shared.metrics.registry import REGISTRY
from evalq.shared.scores.results import entry_keys, read
from evalq.shared.cluster.spec import METRICS_STAGE, entry_chunks, stage_runs
from evalq.shared.scores.stats import Items, columns, score_interval
from evalq.shared.data.versions import Version, in_sample
from evalq.results.dataset_versions import version_of
from evalq.results.labels import latest_agreement

log = logging.getLogger("evalq.history")


@dataclass
class Foreseen:
    """What the history store says of a night before its outputs are written (``foresee``): its
    entries and series (made once: ``record_job`` stores these), its regressions against the suite's
    baseline and how many earlier runs that baseline had."""

    suite: str
    entry_rows: list[dict]
    series: list[dict]
    found: list[dict]
    baseline_runs: int
    dataset: dict | None = None  # how its data differs from the baseline's (evalq.results.dataset_versions)
    version: Version | None = None
    people: dict | None = None  # the suite's last night people labelled: its judges against them
    baseline: dict | None = None  # per (name, field), each instance's baseline mean (the review's)


def foresee(r: redis.Redis, job_id: str, spec: StoredJob, summary: list[dict]) -> Foreseen | None:
    """The regressions a night that ends done has against its suite's baseline, found before its
    outputs are written so that results.json, run.json, report.html and ``evalq run`` say them
    (``with_regressions``); None when history is off or the store could not be read."""
    from evalq.results.history import history_url, open_store

    url = history_url()
    if url is None or not spec or not summary:
        return None
    try:
        entry_rows, series = entries_of(r, job_id, spec, summary)
        version = version_of(r, job_id, spec)
        store = open_store(url)
        run = run_row(r, job_id, spec, "done", summary, None)  # (its generation stage's summary read once)
        found, past, said = store.foresee(run, entry_rows, series, spec.regression, version)
        _pull_labels(store, spec, job_id)
        people = latest_agreement(store.engine, spec.series, spec.tenant)
        before = None
        if spec.review.items:  # the review's "changed since the baseline" (evalq.results.review)
            from evalq.results.review import baseline_means

            before = baseline_means(store.baseline_items(run, series, spec.regression, version))
    except Exception as exc:  # noqa: BLE001  (a database of any kind, down or refusing: the job stands)
        _unrecorded(job_id, url, exc, "not compared with its suite's baseline in")
        return None
    return Foreseen(spec.series, entry_rows, series, found, past, said, version, people, before)


def _pull_labels(store, spec: StoredJob, job_id: str) -> None:
    """People's labels of the suite's previous night, from the job's Phoenix and MLflow sinks
    (``evalq.results.label_pull``): a backend away is logged, and the night goes on without them."""
    from evalq.results.label_pull import before_a_night

    try:
        pulled = before_a_night(store, spec, job_id)
    except Exception as exc:  # noqa: BLE001  (Phoenix or MLflow away, a log gone: the night stands)
        log.warning("job %s: people's labels of the previous night not read: %s: %s", job_id, type(exc).__name__,
                    str(exc).splitlines()[0] if str(exc) else "")
        return
    if pulled is not None and (pulled.counts.get("new") or pulled.counts.get("updated")):
        log.info("job %s: people's labels of the previous night: %s", job_id, pulled.counts)


def with_regressions(summary: list[dict], foreseen: Foreseen | None) -> dict | None:
    """Each regressed entry of ``summary`` gets its ``regressions`` (field, value, baseline, delta,
    p_value, paired, n, baseline_runs); returns run.json's ``regressions`` (suite, found, baseline_runs,
    and how the night's data differs from the baseline's: ``dataset``)."""
    if foreseen is None:
        return None
    for f in foreseen.found:
        summary[f["slot"]].setdefault("regressions", []).append(  # (its entry's metric and name are its own)
            {k: f[k] for k in REGRESSION_FIELDS if k not in ("metric", "name")})
    said = {"suite": foreseen.suite, "found": len(foreseen.found), "baseline_runs": foreseen.baseline_runs}
    if foreseen.dataset:
        said["dataset"] = foreseen.dataset
    if foreseen.people:
        said["people"] = foreseen.people
    return said


def record_job(r: redis.Redis, job_id: str, spec: StoredJob, status: str, summary: list[dict] | None,
               error: str | None = None, foreseen: Foreseen | None = None) -> list[dict] | None:
    """Record the ended job (once, whatever runs twice); returns its regressions, or None
    when history is off or the store could not be written. ``foreseen``: what ``foresee`` found,
    stored as it is (the regressions the outputs say are those recorded)."""
    from evalq.results.history import history_url, open_store

    url = history_url()
    if url is None or not spec:
        return None
    try:
        store = open_store(url)
        entry_rows, series = ((foreseen.entry_rows, foreseen.series) if foreseen is not None
                              else entries_of(r, job_id, spec, summary or []))
        run = run_row(r, job_id, spec, status, summary or [], error)
        version = foreseen.version if foreseen is not None else version_of(r, job_id, spec)
        recorded = store.record(run, entry_rows, series, spec.regression,
                                found=foreseen.found if foreseen is not None else None, version=version,
                                said=foreseen.dataset if foreseen is not None else None)
    except Exception as exc:  # noqa: BLE001  (a database of any kind, down or refusing: the job stands)
        _unrecorded(job_id, url, exc, "not recorded in")
        return None
    if recorded.alert == "pending":
        from evalq.results.alerts import notify

        notify(store, run["suite"], job_id, recorded.regressions, list(recorded.judge_changes))
    return recorded.regressions


def _unrecorded(job_id: str, url: str, exc: Exception, what: str) -> None:
    from evalq.results.history import safe

    log.error("job %s: %s the history store %s: %s: %s", job_id, what, safe(url), type(exc).__name__,
              str(exc).splitlines()[0] if str(exc) else "")


def run_row(r: redis.Redis, job_id: str, spec: StoredJob, status: str, summary: list[dict], error: str | None) -> dict:
    from evalq.results.history import utc
    from datetime import datetime, timezone

    from evalq.results.outputs import job_cost

    judge_blocks = [m["judge"] for m in summary if isinstance(m.get("judge"), dict)]
    stage = r.get(keys.stage_summary(job_id, GENERATE))
    generation = json.loads(stage) if stage else None
    if generation and isinstance(generation.get("judge"), dict):
        judge_blocks.append(generation["judge"])
    model = spec.model or {}
    return {
        "job_id": job_id, "suite": spec.series,
        "request_id": str(spec.request_id) if spec.request_id is not None else None,
        "tenant": spec.tenant, "status": str(status),
        "started_at": utc(spec.submitted_at), "finished_at": datetime.now(timezone.utc).replace(tzinfo=None),
        "source": spec.source, "dataset": (spec.dataset or {}).get("uri"),
        "model": model.get("model") or model.get("runner"), "out": spec.out,
        "n_instances": spec.n_instances, "dataset_digest": (spec.dataset_version or {}).get("digest"),
        "calls": sum(int(b.get("calls", 0)) for b in judge_blocks),
        "tokens": sum(int(b.get("prompt_tokens", 0)) + int(b.get("completion_tokens", 0)) for b in judge_blocks),
        "cost": job_cost(summary, generation), "error": error,
    }


def entries_of(r: redis.Redis, job_id: str, spec: StoredJob, summary: list[dict]) -> tuple[list[dict], list[dict]]:
    """(entry rows, series) of a run: per entry its head and spend; per (entry, field) its
    value, interval, n, the items' standard deviation and per-instance values (a sample of a
    big entry's: ``sample_rate``)."""
    if not summary:
        return [], []
    names = entry_keys(summary)
    rate = sample_rate(spec)
    entry_rows, series = [], []
    for slot, ((key, entry), result, name) in enumerate(zip(stage_runs(spec, METRICS_STAGE), summary, names)):
        judge = result.get("judge") or {}
        identity = judge.get("identity") if isinstance(judge.get("identity"), dict) else None
        entry_rows.append({
            "slot": slot, "metric": entry["id"], "name": name,
            "parameters": json.dumps(entry["parameters"], sort_keys=True, ensure_ascii=False),
            "n": result.get("n"), "n_errors": result.get("n_errors"), "n_skipped": result.get("n_skipped", 0),
            "calls": judge.get("calls"), "cost": judge.get("cost"),
            "tokens": (judge.get("prompt_tokens", 0) + judge.get("completion_tokens", 0)) if judge else None,
            # who judged it: the history compares the entry only with runs of the same judge
            "judge": json.dumps(identity, sort_keys=True) if identity else None,
            "judge_id": identity.get("id") if identity else None})
        kind = REGISTRY.get(entry["id"]).aggregation if entry["id"] in REGISTRY else "mean"
        for field, (items, moments) in entry_series(r, job_id, key, kind, entry["parameters"],
                                                    entry_chunks(spec, entry), spec, rate).items():
            series.append(one_series(slot, entry, name, field, kind, result, items, moments=moments))
    return entry_rows, series


def sample_rate(spec: StoredJob | dict) -> float:
    """The share of a run's instances whose values the history keeps for pairing: all of them up
    to ``EVALQ_HISTORY_MAX_ITEMS`` instances, about that many of a bigger run."""
    limit = int(env_number("EVALQ_HISTORY_MAX_ITEMS", 100_000))
    n = as_stored(spec).n_instances
    return 1.0 if n <= limit else max(limit, 1) / n


@dataclass
class Moments:
    """n, the sums of the values and of their squares, Welford's running mean and M2 (a standard
    deviation without cancellation), and whether every value is 0 or 1: a series over every item,
    whichever of them are kept."""

    n: int = 0
    total: float = 0.0
    total_sq: float = 0.0
    mean: float = 0.0
    m2: float = 0.0
    binary: bool = True

    def add(self, value: float) -> None:
        self.n += 1
        self.total += value
        self.total_sq += value * value
        delta = value - self.mean
        self.mean += delta / self.n
        self.m2 += delta * (value - self.mean)
        self.binary = self.binary and value in (0.0, 1.0)

    @property
    def sd(self) -> float | None:
        return math.sqrt(self.m2 / (self.n - 1)) if self.n > 1 else None


def chunk_values(items: list[tuple[int, dict]], readings: list) -> dict:
    """What the history store needs of one chunk of a metric entry, made by the worker that
    scored it (``readings``: each item's ``evalq.shared.scores.results.read``, in the items' order):
    its scored items' instance ids and, per field, their values in the same order (None where
    an item has no finite value of that field), each column packed as float64s in ``fields_f64``
    (``jsonio.pack_floats``; ``item_fields`` reads an older chunk's plain lists in ``fields``
    too). A jailbreak's injected variants are left out, as ``evalq compare`` leaves them out."""
    ids: list[str] = []
    fields: dict[str, list[float | None]] = {}
    for (_, record), reading in zip(items, readings):
        if record.get("variant") is not None:
            continue
        values = {f: v for f, v in reading.values.items() if math.isfinite(v)}
        if not values:
            continue
        for field, column in fields.items():
            column.append(values.pop(field, None))
        for field, value in values.items():  # a field first seen here: None for the items before
            fields[field] = [None] * len(ids) + [value]
        ids.append(str(record.get("instance_id")))
    # "fields" stays, empty: the final callback of an older evalq (a rolling upgrade) then records
    # the entry unpaired rather than reading the packed columns as numbers
    return {"ids": ids, "fields": {}, "fields_f64": {field: pack_floats(column) for field, column in fields.items()}}


def item_fields(r: redis.Redis, job_id: str, key: str, kind: str, params: dict,
                chunks: int | None = None, spec: StoredJob | None = None, rate: float = 1.0) -> dict[str, Items]:
    """Per field, the entry's scored items as columns (instance ids, values): ``entry_series``'
    kept items."""
    return {field: items for field, (items, _) in entry_series(r, job_id, key, kind, params, chunks, spec,
                                                               rate).items()}


def entry_series(r: redis.Redis, job_id: str, key: str, kind: str, params: dict, chunks: int | None = None,
                 spec: StoredJob | None = None, rate: float = 1.0) -> dict[str, tuple[Items, Moments]]:
    """Per field, the entry's scored items in ``rate``'s sample (``in_sample``) as columns (instance
    ids, values), with the moments of every scored item: from the values its ``chunks`` chunks kept
    (``chunk_values``), read a chunk at a time, when every one of them did, else from its item
    records (a jailbreak's injected variants left out either way). The items come in position
    order, whatever order the chunks finished in and Redis keeps them in: a suite's runs over the
    same instances then list them alike, and the regression check pairs them without a lookup."""
    keep = in_sample(rate)
    if chunks is not None:
        fields: dict[str, tuple[list, list, Moments]] = {}
        seen = 0
        for _, raw in _chunks_values(r, job_id, key, spec):
            if raw is None:
                break  # a chunk that kept none: the records are read instead
            seen += 1
            chunk = json.loads(raw)
            ids, packed = chunk["ids"], chunk.get("fields_f64")  # an older evalq's chunk: "fields", lists
            mask = [keep(iid) for iid in ids] if keep is not None else None
            columns = ({f: unpack_floats(t, none=True) for f, t in packed.items()} if packed is not None
                       else chunk["fields"])
            for field, column in columns.items():
                into_ids, into_values, moments = fields.setdefault(field, ([], [], Moments()))
                for k, (iid, value) in enumerate(zip(ids, column)):
                    if value is not None:
                        moments.add(value)
                        if mask is None or mask[k]:
                            into_ids.append(iid)
                            into_values.append(value)
        if seen == chunks:
            return {field: ((ids, values), moments) for field, (ids, values, moments) in fields.items()}
    found: dict[str, tuple[list[tuple[int, str, float]], Moments]] = {}
    for position, raw in as_stored(spec, job_id).records.scan(r, key):
        record = json.loads(raw)
        if record.get("variant") is not None:
            continue
        iid = str(record.get("instance_id"))
        kept = keep is None or keep(iid)
        for field, value in read(kind, params, record).values.items():
            if math.isfinite(value):
                items, moments = found.setdefault(field, ([], Moments()))
                moments.add(value)
                if kept:
                    items.append((int(position), iid, value))
    out = {}
    for field, (items, moments) in found.items():
        items.sort(key=lambda item: item[0])
        out[field] = (([iid for _, iid, _ in items], [value for _, _, value in items]), moments)
    return out


def _chunks_values(r: redis.Redis, job_id: str, key: str, spec: StoredJob | None):
    """(start, values) of each recorded chunk that left them, in start order, one at a time."""
    yield from as_stored(spec, job_id).records.values(r, key)


def one_series(slot: int, entry: dict, name: str, field: str, kind: str, result: dict, items: Items,
               moments: Moments | None = None) -> dict:
    """A series' row: the value and interval results.json reports (else the items' mean and
    interval), n, the items' standard deviation (``moments``: over every item, where ``items`` are a
    sample; else over ``items``), and the items (columns) themselves."""
    from evalq.results.regressions import worse_direction

    if moments is None:
        moments = Moments()
        for v in columns(items)[1]:
            moments.add(v)
    n = moments.n
    value, ci = reported(result, kind, field)
    if value is None and n:
        value = moments.total / n
        bounds = REGISTRY.get(entry["id"]).bounds if entry["id"] in REGISTRY else None
        ci = score_interval(n, moments.total, moments.total_sq, moments.binary, bounds)
    return {"slot": slot, "metric": entry["id"], "name": name, "field": field, "value": value,
            "ci95": ci, "n": n, "sd": moments.sd, "worse": worse_direction(field, entry["id"]),
            "items": items}


def reported(result: dict, kind: str, field: str) -> tuple[float | None, list | None]:
    """The value and interval results.json reports for an entry's field, where it has one."""
    score = result.get("score")
    if kind == "defect" and isinstance(score, dict):
        rate = score.get("any") if isinstance(score.get("any"), dict) else score
        return rate.get("defect_rate"), rate.get("ci95")
    if kind == "rating" and isinstance(score, dict):
        return score.get("mean"), score.get("ci95")
    ci = result.get("ci95")
    if isinstance(score, (int, float)) and not isinstance(score, bool) and field == "mean":
        return float(score), ci if isinstance(ci, list) else None
    if isinstance(score, dict) and isinstance(score.get(field), (int, float)):
        return float(score[field]), ci.get(field) if isinstance(ci, dict) else None
    return None, None
