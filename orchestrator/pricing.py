"""What a chunk costs its queue, and what each tenant has spent of it lately: the prices the
dispatcher's fair queueing (``evalq.orchestrator.dispatch``) weighs chunks with, and the tokens a
queue's deployment takes in a minute that a tenant's ``max_share`` is a share of."""

from __future__ import annotations

import time

import redis

from evalq.shared.cluster import keys
from evalq.shared.cluster.spec import companions, entry_of, queue_of
from evalq.shared.job.stored import stored_job

SHARE_WINDOW = 60.0  # seconds over which shares (and tenant caps) are measured
PROMPT_ESTIMATE = 400  # tokens per judge call assumed before any was measured


def chunk_cost(r: redis.Redis, job_id: str, desc: list, cache: dict[str, float]) -> float:
    """What the chunk is expected to cost its queue: tokens for judge and generate entries,
    seconds for the others (per item, measured from what the entry has done so far)."""
    metric_key, start, stop = desc[0], desc[1], desc[2]
    key = f"{job_id}|{metric_key}"
    if key not in cache:
        spec = stored_job(r, job_id)
        entry = entry_of(spec, metric_key)
        done = int(r.get(keys.recorded_total(job_id, metric_key)) or 0)
        if entry.get("regions"):  # judge or endpoint model: tokens
            prompt, completion, calls, reserved = r.hmget(keys.accounting(job_id, metric_key), "prompt_tokens",
                                                          "completion_tokens", "calls", "reserved_tokens")
            if done and calls and int(calls):
                unit = (int(prompt or 0) + int(completion or 0)) / done
            elif calls and int(calls) and reserved:  # calls made, no item finished yet: what they reserved
                unit = int(reserved) / int(calls)
            else:
                judge = spec.judges.get((entry.get("parameters") or {}).get("judge"), {})
                unit = float(judge.get("max_tokens") or (spec.model or {}).get("max_tokens") or 256)
                unit += PROMPT_ESTIMATE
        else:  # cpu, gpu, a local model: seconds (one timing per chunk: a few hundred at most),
            unit = 0.0  # of the entry and of those its chunks score with it
            for scored in (metric_key, *companions(entry)):
                done = int(r.get(keys.recorded_total(job_id, scored)) or 0)
                seconds = keys.timing_sums(r.hgetall(keys.timings(job_id, scored)))[0]
                unit += seconds / done if done and seconds > 0 else 1.0
        cache[key] = max(unit, 1e-6)
    return cache[key] * (stop - start)


def recent_use(r: redis.Redis, queue: str) -> dict[str, float]:
    """Tenant -> cost sent on the queue within the last minute."""
    used: dict[str, float] = {}
    for member in r.zrangebyscore(keys.sched(queue, "log"), time.time() - SHARE_WINDOW, "+inf"):
        _, tenant, cost, _ = member.decode().split("|")
        used[tenant] = used.get(tenant, 0.0) + float(cost)
    return used


def queue_tpm(r: redis.Redis, queue: str, job_ids: list[str]) -> float:
    """The tokens a judge (or generate) queue's deployment takes in ``SHARE_WINDOW``: the operator's
    catalogue's for its region when it lists one (a job's own declaration never sets a tenant's cap),
    else what an active job's spec declares. A deployment that learns its TPM (``"tpm": "auto"``)
    counts what it has learned by now (its floor until it learned anything); one of adaptive
    capacity states no TPM and counts none: its tenants' shares hold their calls in flight instead
    (``evalq.workers.judge.concurrency``). 0: no token cap at dispatch."""
    from evalq.shared.judging.capacity import AUTO, DEFAULT_TPM_FLOOR
    from evalq.shared.judging.deployments import operator_catalogue
    from evalq.shared.cluster.spec import runs

    catalogue = operator_catalogue()
    region = queue.split(".", 1)[1] if "." in queue else queue
    listed = [(name, d) for name, d in (catalogue.deployments.items() if catalogue else ()) if d.get("region") == region]
    if listed:
        total = 0.0
        for name, d in listed:
            tpm = d.get("tpm")
            if tpm == AUTO:
                learned = r.hget(keys.budget(f"catalogue-{name}", "learn"), "tpm")
                tpm = float(learned) if learned else float(d.get("tpm_floor") or DEFAULT_TPM_FLOOR)
            if isinstance(tpm, (int, float)) and not isinstance(tpm, bool):
                total += float(tpm) * SHARE_WINDOW / float(d.get("window_seconds") or 60)
        return total

    for job_id in job_ids:
        for _, entry in runs(stored_job(r, job_id)):
            for region, tpm in entry.get("regions") or []:
                if queue_of(entry, region) == queue and isinstance(tpm, (int, float)):
                    return float(tpm)
    return 0.0
