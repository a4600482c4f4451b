"""The outputs of a job, written by its final callback from Redis to a local
directory (of the worker that runs the callback) or an S3 prefix:

- ``results.json``: HarpIA's list, one aggregate per enabled metric entry;
- ``log.jsonl``: one line per (instance, metric entry), after one line per
  generated output (``"metric": "generate"``) when the model under test ran;
  a line names its entry by its metric, parameters and position
  (``evalq.shared.data.loglines``);
- ``run.json``: what ran: job id, status, source, dataset and how it was
  read, bad records skipped, the generation stage's summary, times and versions,
  and ``cost`` (judges' and generation's; null when nothing had a price).

Everything comes from the job's spec and records in Redis, so whichever
process runs the callback writes the same files.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Iterator

import redis

from evalq.shared.job.stored import StoredJob
from evalq.shared.job.schema import entry_head as head
from evalq.shared.data.loglines import log_head
from evalq.shared.model.runners import GENERATE
from evalq.shared.data.storage import Destination
from evalq.shared.cluster.status import Status
from evalq.shared.cluster.spec import entry_chunks, is_variants, runs as all_runs, span, variants_of

LOG_BATCH = 2000


def write_outputs(r: redis.Redis, spec: StoredJob, job_id: str, summary: list[dict], run: dict,
                  dest: Destination, baseline: dict | None = None) -> None:
    """``baseline``: per (entry name, field), each instance's value in the suite's baseline (the review's)."""
    from evalq.results.report import ReportBuilder

    cancelled = run.get("status") == Status.CANCELLED
    report = ReportBuilder(summary, run)
    picker = None if cancelled else _picker(spec, job_id, summary, baseline)
    # Entries whose chunks all left a view (workers make one per chunk) are reported from
    # those; the others (a chunk given up, a cancelled job) from their log lines.
    streamed = set()
    for slot, (key, entry) in enumerate(spec.metrics.items()):
        if not report.add_views(slot, _views(r, spec, key), expect=entry_chunks(spec, entry)):
            streamed.add(key)
    with dest.open_text("results.json") as f:
        f.write(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    with dest.open_text("log.jsonl") as f:
        for line, position, key in _log_entries(r, spec, cancelled):
            f.write(line)
            f.write("\n")
            if key in streamed:
                report.add(json.loads(line), position)
            if picker is not None and picker.wants(key):
                picker.offer(key, position, line)
    if picker is not None:  # the night's items for a person (evalq.results.review), said in run.json and the report
        from evalq.results.review import mark, said, with_texts

        rows = picker.pick()
        with_texts(rows, _instances_at(r, spec, [row["position"] for row in rows]))
        with dest.open_text("review.jsonl") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        run["review"] = said(rows, mark(spec, job_id, rows))
    with dest.open_text("run.json") as f:
        f.write(json.dumps(run, indent=2, ensure_ascii=False) + "\n")
    with dest.open_text("report.html") as f:
        f.write(report.html(_instances_at(r, spec, report.worst_positions())))


def _picker(spec: StoredJob, job_id: str, summary: list[dict], baseline: dict | None):
    """The review's picker over the job's judge entries (None where the job asks for no review)."""
    import evalq.shared.job.catalogue  # noqa: F401  (registers the built-in metrics)
    from evalq.shared.metrics.registry import REGISTRY

    settings = spec.review
    if not settings.items:
        return None
    from evalq.results.review import Picker
    from evalq.shared.scores.results import entry_keys

    names = entry_keys(summary)
    entries = {key: (name, REGISTRY.get(entry["id"]).aggregation, entry["parameters"])
               for (key, entry), name in zip(spec.metrics.items(), names)
               if entry["id"] in REGISTRY and REGISTRY.get(entry["id"]).queue == "judge"}
    return Picker(job_id, settings, entries, baseline) if entries else None


def _views(r: redis.Redis, spec: StoredJob, key: str) -> Iterator[dict | None]:
    """Each chunk's report view (None for a chunk that left none), in start order."""
    for raw in spec.records.views(r, key):
        yield json.loads(raw) if raw is not None else None


def _instances_at(r: redis.Redis, spec: StoredJob, positions: list[int]) -> dict[int, dict]:
    found = {p: json.loads(raw) for p, raw in zip(positions, spec.instances.lines_at(r, positions)) if raw is not None}
    return dict(zip(found, spec.instances.with_shared(r, list(found.values()))))


def run_info(spec: StoredJob, job_id: str, generation: dict | None, status: str = Status.DONE,
             summary: list[dict] | None = None, regressions: dict | None = None) -> dict:
    """run.json: the job's identity, times, entries, cost, what its sinks took and (``regressions``,
    ``evalq.results.recording.with_regressions``) how it compares with its suite's baseline."""
    from importlib.metadata import version

    info: dict = {"job_id": job_id, "status": status, "source": spec.source,
                  "evalq_version": version("evalq")}
    started = spec.submitted_at
    finished = datetime.now(timezone.utc)
    if started:
        info["started_at"] = started
    info["finished_at"] = finished.isoformat(timespec="seconds")
    if started:
        info["wall_time"] = round((finished - datetime.fromisoformat(started)).total_seconds(), 3)
    info["n_instances"] = spec.n_instances
    if spec.jailbreak:
        info["jailbreak"] = spec.jailbreak
    info["metrics"] = [head(entry) for entry in spec.metrics.values()]
    if spec.categories:
        info["categories"] = spec.categories
    if spec.dataset:
        info["dataset"] = spec.dataset
    if spec.request_id:
        info["request_id"] = spec.request_id
    if generation is not None:
        info["generation"] = generation
    info["cost"] = job_cost(summary or [], generation)
    from evalq.results.sinks import exports_total

    exports = exports_total(summary or [])
    if exports:
        info["exports"] = exports  # what each sink took of the scores, never lost in silence
    if regressions is not None:
        info["regressions"] = regressions
    return info


def job_cost(summary: list[dict], generation: dict | None) -> float | None:
    """The job's cost: its metric entries' judge costs and the generation stage's,
    in the prices' currency; None when no endpoint it called had a price."""
    blocks = [m.get("judge") or {} for m in summary] + [(generation or {}).get("judge") or {}]
    costs = [b["cost"] for b in blocks if b.get("cost") is not None]
    return round(sum(costs), 6) if costs else None


def _log_entries(r: redis.Redis, spec: StoredJob, cancelled: bool = False) -> Iterator[tuple[str, int, str]]:
    """(log line, instance position, run key): generated outputs first, then one JSON line
    per (metric entry, instance), entry by entry in job order, instances in job order."""
    missing = {"skipped": "the job was cancelled"} if cancelled else {"error": "no result recorded"}
    runs = all_runs(spec)
    kept = spec.records
    slots = {key: slot for slot, key in enumerate(spec.metrics)}
    for key, entry in runs:
        n = span(spec, entry) if key != GENERATE else spec.n_instances
        if is_variants(key):
            # what the model answered to an entry's variants: "stage": "variants" and the entry's
            # place (``variants_for``), never ``entry``: readers of scores pass these lines by
            head_obj = {**log_head(entry, None, False), "stage": "variants", "variants_for": slots[variants_of(key)]}
        else:
            # generated outputs' lines name no parameters: run.json's generation holds the model's
            head_obj = log_head(entry, slots.get(key), key != GENERATE and spec.log_parameters)
        head_json = json.dumps(head_obj, ensure_ascii=False)[1:-1]
        # a chunk's part at a time where the records are parts (each read once), else LOG_BATCH of them
        step = kept.read_step(key, LOG_BATCH)
        for start in range(0, n, step):
            stop = min(start + step, n)
            records = kept.get_many(r, key, list(range(start, stop)))
            if None in records:  # rare: look the instances up once per batch
                instances = [json.loads(raw) for raw in spec.instances.lines(r, start, stop)]
            for i, raw in enumerate(records):
                if raw is not None:
                    yield _with_head(raw if isinstance(raw, str) else raw.decode("utf-8"), head_json), start + i, key
                elif key != GENERATE or "actual-output" not in instances[i]:
                    # (a record with its own output had nothing generated)
                    variant = {"variant": instances[i]["variant"]} if "variant" in instances[i] else {}
                    yield json.dumps({"instance_id": instances[i]["id"], **head_obj, **variant, **missing},
                                     ensure_ascii=False), start + i, key


_ID = '{"instance_id": '
_decoder = json.JSONDecoder()


def _with_head(record: str, head_json: str) -> str:
    """The log line of a stored item record: the metric's head spliced in after
    the instance id, so a million results are not decoded and encoded again
    (workers write records as ``{"instance_id": ..., <the rest>}``)."""
    _, end = _decoder.raw_decode(record, len(_ID))
    return f"{record[:end]}, {head_json}{record[end:]}"
