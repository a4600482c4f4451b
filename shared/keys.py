"""Every Redis key evalq writes, built in one place.

All keys of one job share the prefix ``evalq:{<job>}:`` (the braces are a Redis
Cluster hash tag, so one job's keys live on one shard and Lua scripts may touch
several of them):

    evalq:{J}:spec           STRING  job spec as run (metrics, resolved parameters, counts)
    evalq:{J}:instances      LIST    one JSON instance per element, in job order
    evalq:{J}:res:{M}        HASH    instance index -> JSON item record, for metric key M
    evalq:{J}:time:{M}       HASH    chunk start -> seconds spent scoring that chunk
    evalq:{J}:summary        STRING  JSON list of aggregated metric results (results.json)
    evalq:{J}:finalized      STRING  set once by the callback that wrote the summary
    evalq:{J}:status         STRING  running | done | failed

Item records are written with HSET on a field derived from the instance's
position, so a redelivered task overwrites instead of adding: nothing is
counted twice.
"""

from __future__ import annotations

PREFIX = "evalq"


def job_prefix(job_id: str) -> str:
    return f"{PREFIX}:{{{job_id}}}"


def spec(job_id: str) -> str:
    return f"{job_prefix(job_id)}:spec"


def instances(job_id: str) -> str:
    return f"{job_prefix(job_id)}:instances"


def results(job_id: str, metric_key: str) -> str:
    return f"{job_prefix(job_id)}:res:{metric_key}"


def timings(job_id: str, metric_key: str) -> str:
    return f"{job_prefix(job_id)}:time:{metric_key}"


def summary(job_id: str) -> str:
    return f"{job_prefix(job_id)}:summary"


def finalized(job_id: str) -> str:
    return f"{job_prefix(job_id)}:finalized"


def status(job_id: str) -> str:
    return f"{job_prefix(job_id)}:status"


def all_job_keys(job_id: str, metric_keys: list[str]) -> list[str]:
    keys = [spec(job_id), instances(job_id), summary(job_id), finalized(job_id), status(job_id)]
    for m in metric_keys:
        keys += [results(job_id, m), timings(job_id, m)]
    return keys
