"""results.json and log.jsonl, written by the orchestrator from Redis."""

from __future__ import annotations

import json
import os
from pathlib import Path

import redis

from shared import keys
from shared.job import Job

LOG_BATCH = 2000


def write_outputs(r: redis.Redis, job: Job, job_id: str, summary: list[dict], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    _atomic_write(out_dir / "results.json", json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    tmp = out_dir / "log.jsonl.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for line in log_lines(r, job, job_id):
            f.write(line)
            f.write("\n")
    os.replace(tmp, out_dir / "log.jsonl")


def log_lines(r: redis.Redis, job: Job, job_id: str):
    """One JSON line per (metric, instance), metric by metric in job order."""
    n = len(job.instances)
    for m in job.metrics:
        head = {"metric": m.id}
        if m.key != m.id:
            head["name"] = m.key
        head["parameters"] = m.params_json()
        rkey = keys.results(job_id, m.key)
        for start in range(0, n, LOG_BATCH):
            fields = [str(i) for i in range(start, min(start + LOG_BATCH, n))]
            for i, raw in zip(range(start, start + len(fields)), r.hmget(rkey, fields)):
                record = json.loads(raw) if raw is not None else {
                    "instance_id": job.instances[i]["id"], "error": "no result recorded"}
                line = {"instance_id": record["instance_id"], **head}
                if "result" in record:
                    line["result"] = record["result"]
                if record.get("error") is not None:
                    line["error"] = record["error"]
                if record.get("skipped") is not None:
                    line["skipped"] = record["skipped"]
                yield json.dumps(line, ensure_ascii=False)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
