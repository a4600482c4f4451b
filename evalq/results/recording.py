"""The final callback's last step: record the ended job in the history store, judge its
regressions against the suite's past, and send the alert (``evalq.results.alerts``).

A run's series come from what the callback already has: results.json's content for each
entry's value and interval, and the per-instance values that pair runs by instance id,
which the worker that scored each chunk kept beside its records (``chunk_values``), so
the callback parses no item record (it reads the records only for an entry some chunk of
which left no values: a chunk given up, a cancelled job). At most ``EVALQ_HISTORY_MAX_ITEMS``
items per entry are stored, default 1,000,000; a bigger entry is compared unpaired.
Recording never fails the job: an unreachable database is logged, and the outputs stand.
"""

from __future__ import annotations

import json
import logging
import math

import redis

from evalq.shared.cluster import keys
from evalq.shared.core.config import env_number
from evalq.shared.core.jsonio import pack_floats, unpack_floats
from evalq.shared.model.runners import GENERATE
from evalq.shared.job.nightly import Regression, suite_of
from evalq.shared.metrics.registry import REGISTRY
from evalq.shared.scores.results import entry_keys, read
from evalq.shared.cluster.spec import METRICS_STAGE, entry_chunks, stage_runs
from evalq.shared.scores.stats import Items, columns, score_interval
from evalq.shared.store import records as stored_records

log = logging.getLogger("evalq.history")


def record_job(r: redis.Redis, job_id: str, spec: dict, status: str, summary: list[dict] | None,
               error: str | None = None) -> list[dict] | None:
    """Record the ended job (once, whatever runs twice); returns its regressions, or None
    when history is off or the store could not be written."""
    from evalq.results.history import history_url, open_store, safe

    url = history_url()
    if url is None or not spec:
        return None
    try:
        store = open_store(url)
        entry_rows, series = entries_of(r, job_id, spec, summary or [])
        run = run_row(r, job_id, spec, status, summary or [], error)
        recorded = store.record(run, entry_rows, series, Regression.model_validate(spec.get("regression") or {}).resolved())
    except Exception as exc:  # noqa: BLE001  (a database of any kind, down or refusing: the job stands)
        log.error("job %s: not recorded in the history store %s: %s: %s", job_id, safe(url), type(exc).__name__,
                  str(exc).splitlines()[0] if str(exc) else "")
        return None
    if recorded.alert == "pending":
        from evalq.results.alerts import notify

        notify(store, run["suite"], job_id, recorded.regressions)
    return recorded.regressions


def run_row(r: redis.Redis, job_id: str, spec: dict, status: str, summary: list[dict], error: str | None) -> dict:
    from evalq.results.history import utc
    from datetime import datetime, timezone

    from evalq.results.outputs import job_cost

    judge_blocks = [m["judge"] for m in summary if isinstance(m.get("judge"), dict)]
    stage = r.get(keys.stage_summary(job_id, GENERATE))
    generation = json.loads(stage) if stage else None
    if generation and isinstance(generation.get("judge"), dict):
        judge_blocks.append(generation["judge"])
    model = spec.get("model") or {}
    return {
        "job_id": job_id, "suite": spec.get("suite") or suite_of(spec.get("source", "")),
        "request_id": str(spec["request_id"]) if spec.get("request_id") is not None else None,
        "tenant": (spec.get("scheduling") or {}).get("tenant"), "status": str(status),
        "started_at": utc(spec.get("submitted_at")), "finished_at": datetime.now(timezone.utc).replace(tzinfo=None),
        "source": spec.get("source"), "dataset": (spec.get("dataset") or {}).get("uri"),
        "model": model.get("model") or model.get("runner"), "out": spec.get("out"),
        "n_instances": spec.get("n_instances"),
        "calls": sum(int(b.get("calls", 0)) for b in judge_blocks),
        "tokens": sum(int(b.get("prompt_tokens", 0)) + int(b.get("completion_tokens", 0)) for b in judge_blocks),
        "cost": job_cost(summary, generation), "error": error,
    }


def entries_of(r: redis.Redis, job_id: str, spec: dict, summary: list[dict]) -> tuple[list[dict], list[dict]]:
    """(entry rows, series) of a run: per entry its head and spend; per (entry, field) its
    value, interval, n, the items' standard deviation and per-instance values."""
    if not summary:
        return [], []
    names = entry_keys(summary)
    limit = int(env_number("EVALQ_HISTORY_MAX_ITEMS", 1_000_000))
    entry_rows, series = [], []
    for slot, ((key, entry), result, name) in enumerate(zip(stage_runs(spec, METRICS_STAGE), summary, names)):
        judge = result.get("judge") or {}
        entry_rows.append({
            "slot": slot, "metric": entry["id"], "name": name,
            "parameters": json.dumps(entry["parameters"], sort_keys=True, ensure_ascii=False),
            "n": result.get("n"), "n_errors": result.get("n_errors"), "n_skipped": result.get("n_skipped", 0),
            "calls": judge.get("calls"), "cost": judge.get("cost"),
            "tokens": (judge.get("prompt_tokens", 0) + judge.get("completion_tokens", 0)) if judge else None})
        kind = REGISTRY.get(entry["id"]).aggregation if entry["id"] in REGISTRY else "mean"
        for field, items in item_fields(r, job_id, key, kind, entry["parameters"],
                                        entry_chunks(spec, entry), spec).items():
            series.append(one_series(slot, entry, name, field, kind, result, items,
                                     keep_items=len(items[0]) <= limit))
    return entry_rows, series


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
                chunks: int | None = None, spec: dict | None = None) -> dict[str, Items]:
    """Per field, the entry's scored items as columns (instance ids, values): from the values its
    ``chunks`` chunks kept (``chunk_values``) when every one of them did, else from its item
    records (a jailbreak's injected variants left out either way). The items come in position
    order, whatever order the chunks finished in and Redis keeps them in: a suite's runs over the
    same instances then list them alike, and the regression check pairs them without a lookup."""
    fields: dict[str, Items] = {}
    if chunks is None:
        kept = {}
    elif stored_records.in_parts(spec or {}):  # in the metadata of the chunks' parts
        kept = {start: raw for start, raw in stored_records.chunk_values(spec, r, job_id, key) if raw is not None}
    else:
        kept = r.hgetall(keys.values(job_id, key))
    if chunks is not None and len(kept) == chunks:
        for _, raw in sorted(kept.items(), key=lambda start_raw: int(start_raw[0])):  # by the chunk's start
            chunk = json.loads(raw)
            ids, packed = chunk["ids"], chunk.get("fields_f64")  # an older evalq's chunk: "fields", lists
            columns = ({f: unpack_floats(t, none=True) for f, t in packed.items()} if packed is not None
                       else chunk["fields"])
            for field, column in columns.items():
                into_ids, into_values = fields.setdefault(field, ([], []))
                for iid, value in zip(ids, column):
                    if value is not None:
                        into_ids.append(iid)
                        into_values.append(value)
        return fields
    found: dict[str, list[tuple[int, str, float]]] = {}
    for position, raw in stored_records.scan(r, spec or {}, job_id, key):
        record = json.loads(raw)
        if record.get("variant") is not None:
            continue
        for field, value in read(kind, params, record).values.items():
            if math.isfinite(value):
                found.setdefault(field, []).append((int(position), str(record.get("instance_id")), value))
    for field, items in found.items():
        items.sort(key=lambda item: item[0])
        fields[field] = ([iid for _, iid, _ in items], [value for _, _, value in items])
    return fields


def one_series(slot: int, entry: dict, name: str, field: str, kind: str, result: dict, items: Items,
               keep_items: bool = True) -> dict:
    """A series' row: the value and interval results.json reports (else the items' mean and
    interval), n, the items' standard deviation, and the items (columns) themselves when kept."""
    from evalq.results.regressions import worse_direction

    values = list(columns(items)[1])
    n = len(values)
    mean = sum(values) / n if n else None
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else None
    value, ci = reported(result, kind, field)
    if value is None and mean is not None:
        value = mean
        bounds = REGISTRY.get(entry["id"]).bounds if entry["id"] in REGISTRY else None
        ci = score_interval(n, sum(values), sum(v * v for v in values), all(v in (0.0, 1.0) for v in values), bounds)
    return {"slot": slot, "metric": entry["id"], "name": name, "field": field, "value": value,
            "ci95": ci, "n": n, "sd": sd, "worse": worse_direction(field, entry["id"]), "items": items if keep_items else None}


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
