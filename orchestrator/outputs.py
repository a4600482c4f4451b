"""The outputs of a run, written by the orchestrator from Redis to a local
directory or an S3 prefix:

- ``results.json``: HarpIA's list, one aggregate per enabled metric entry;
- ``log.jsonl``: one line per (instance, metric entry), after one line per
  generated output (``"metric": "generate"``) when the model under test ran;
- ``run.json``: what ran: job id, source, dataset and how it was read, bad
  records skipped, the generation stage's summary, times and versions.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Iterator

import redis

from evalq.shared import keys
from evalq.shared.job import Job
from evalq.shared.model import GENERATE
from evalq.shared.storage import Destination

LOG_BATCH = 2000


def write_outputs(r: redis.Redis, job: Job, job_id: str, summary: list[dict], run: dict,
                  dest: Destination) -> None:
    with dest.open_text("results.json") as f:
        f.write(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    with dest.open_text("log.jsonl") as f:
        for line in log_lines(r, job, job_id):
            f.write(line)
            f.write("\n")
    with dest.open_text("run.json") as f:
        f.write(json.dumps(run, indent=2, ensure_ascii=False) + "\n")


def run_info(job: Job, job_id: str, generation: dict | None, started: datetime, wall: float) -> dict:
    from importlib.metadata import version

    info: dict = {"job_id": job_id, "source": job.source, "evalq_version": version("evalq"),
                  "started_at": started.isoformat(timespec="seconds"),
                  "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  "wall_time": round(wall, 3), "n_instances": len(job.instances),
                  "metrics": [m.head() for m in job.metrics]}
    if job.categories:
        info["categories"] = job.categories
    if job.dataset is not None:
        info["dataset"] = {"uri": job.dataset.uri, "format": job.dataset.format, "read_as": job.mapping,
                           "bad_records_skipped": job.bad_records.count}
        if job.bad_records.shown:
            info["dataset"]["bad_records"] = job.bad_records.shown
    if generation is not None:
        info["generation"] = generation
    return info


def log_lines(r: redis.Redis, job: Job, job_id: str) -> Iterator[str]:
    """Generated outputs first, then one JSON line per (metric, instance), metric
    by metric in job order, instances in job order."""
    n = len(job.instances)
    for m in job.runs:
        head = m.head()
        head_json = json.dumps(head, ensure_ascii=False)[1:-1]
        rkey = keys.results(job_id, m.key)
        for start in range(0, n, LOG_BATCH):
            stop = min(start + LOG_BATCH, n)
            records = r.hmget(rkey, [str(p) for p in range(start, stop)])
            if None in records:  # rare: look the instances up once per batch
                instances = [json.loads(raw) for raw in r.lrange(keys.instances(job_id), start, stop - 1)]
            for i, raw in enumerate(records):
                if raw is not None:
                    yield _with_head(raw.decode("utf-8"), head_json)
                elif m.key != GENERATE or "actual-output" not in instances[i]:
                    # (a record with its own output had nothing generated)
                    yield json.dumps({"instance_id": instances[i]["id"], **head, "error": "no result recorded"},
                                     ensure_ascii=False)


_ID = '{"instance_id": '
_decoder = json.JSONDecoder()


def _with_head(record: str, head_json: str) -> str:
    """The log line of a stored item record: the metric's head spliced in after
    the instance id, so a million results are not decoded and encoded again
    (workers write records as ``{"instance_id": ..., <the rest>}``)."""
    _, end = _decoder.raw_decode(record, len(_ID))
    return f"{record[:end]}, {head_json}{record[end:]}"
