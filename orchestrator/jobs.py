"""Operating jobs on a cluster: status (one job, or the recent ones) and cancel (resume is
``evalq.orchestrator.watch``'s: it is what the sweeper does)."""

from __future__ import annotations

import json
import logging
import time

import redis

from evalq.shared.cluster import keys
from evalq.shared.core.errors import InfraError
from evalq.shared.cluster.spec import entry_queues, run_items, runs as all_runs
from evalq.shared.job.stored import load_job
from evalq.shared.cluster.status import FINAL, Status, status_of

log = logging.getLogger("evalq.jobs")


def cancel_job(r: redis.Redis, broker_url: str, job_id: str) -> str:
    """Mark the job cancelled (workers drop its pending tasks unrun) and have its
    partial outputs written, with ``"status": "cancelled"`` in run.json."""
    from evalq.orchestrator.app import client_app
    from evalq.orchestrator.stages import fire_callback
    from evalq.shared.cluster.spec import METRICS_STAGE

    status = status_of(r, job_id)
    if not status:
        raise InfraError(f"job {job_id}: no such job (expired or never submitted)")
    if status in FINAL:
        return status
    r.set(keys.status(job_id), Status.CANCELLED, keepttl=True)
    app = client_app(broker_url)
    spec = load_job(r, job_id)
    if spec is not None and spec.place is not None:  # and in the store: a job rebuilt after a loss stays cancelled
        from evalq.shared.store.ledger import cancel
        from evalq.shared.store.place import StoreUnavailable

        try:
            cancel(spec.place)
        except StoreUnavailable as exc:
            log.warning("job %s: cancelled in Redis, but the job store did not take it: %s", job_id, exc)
    if spec is not None:  # its chunks still in line are never sent; its window goes to the others
        from evalq.orchestrator import dispatch

        dispatch.send_now(app, r, dispatch.drop(r, job_id, spec))
    # the final callback writes what was recorded; chunks in flight may still finish
    fire_callback(app, r, job_id, METRICS_STAGE, force=True)
    return Status.CANCELLED


def job_status(r: redis.Redis, job_id: str) -> dict:
    """State, items done/total per metric entry and stage, rate, ETA, judge
    accounting, and the depth of every queue the job uses."""
    status = status_of(r, job_id)
    if not status:
        raise InfraError(f"job {job_id}: no such job (expired or never submitted)")
    info: dict = {"job_id": job_id, "status": status}
    spec = load_job(r, job_id)
    if status == Status.INVALID or spec is None:
        raw_error = r.get(keys.error(job_id))
        if raw_error:
            info["errors"] = json.loads(raw_error)
        return info
    info.update({"source": spec.source, "submitted_at": spec.submitted_at, "out": spec.out,
                 "request_id": spec.request_id, "n_instances": spec.n_instances})
    error = r.get(keys.error(job_id))
    if error:
        info["error"] = error.decode()
    runs = all_runs(spec)
    pipe = r.pipeline(transaction=False)
    for key, _ in runs:
        pipe.get(keys.recorded_total(job_id, key))
        pipe.hgetall(keys.accounting(job_id, key))
        pipe.hlen(keys.kept(job_id, key))
    replies = pipe.execute()
    entries, done_total, items_total, queues, going = [], 0, 0, set(), {}
    for n, (key, entry) in enumerate(runs):
        done, acct = int(replies[3 * n] or 0), replies[3 * n + 1]
        going[key] = done + int(replies[3 * n + 2] or 0)  # and what running chunks have kept (a judge's)
        total = run_items(spec, key, entry)
        row = {"entry": key, "metric": entry.id, "done": done, "total": total}
        if entry.name:
            row["name"] = entry.name
        if acct:
            from evalq.results.summary import judge_accounting

            row["judge"] = judge_accounting(acct)
        entries.append(row)
        done_total += done
        items_total += total
        queues.update(entry_queues(entry))
    info["entries"] = entries
    info["items"] = {"done": done_total, "total": items_total}
    plan = {k.decode(): v.decode() for k, v in r.hgetall(keys.plan(job_id)).items()}
    info["stages"] = {stage: {"chunks": int(plan.get(f"{stage}:total", 0)),
                              "sent": int(plan.get(f"{stage}:sent", 0)),
                              "finished": r.scard(keys.chunks_done(job_id, stage))}
                      for stage in ("generate", "metrics") if f"{stage}:total" in plan}
    if spec.submitted_at and status not in FINAL:
        from evalq.orchestrator.eta import at_once, by_stage

        elapsed = time.time() - spec.submitted_epoch
        info["rate_items_per_s"] = round(sum(going.values()) / elapsed if elapsed > 0 else 0.0, 2)
        left, stage = at_once(by_stage(spec, going), elapsed)  # the slowest stage's time left
        info["eta_s"] = round(left) if left is not None else None
        if stage is not None:
            info["eta_stage"] = stage
    info["queues"] = {q: r.llen(q) for q in sorted(queues)}
    info["scheduling"] = spec.scheduling
    if status not in FINAL:
        info["dispatch"] = dispatch_view(r, job_id, sorted(queues))
    from evalq.orchestrator.parking import batch_view
    from evalq.orchestrator.watch import recovery

    batches = batch_view(r, job_id)
    if batches:
        info["batch"] = batches
    steps = recovery(r, job_id)
    if steps:
        info["recovery"] = steps
    return info


def dispatch_view(r: redis.Redis, job_id: str, queues: list[str]) -> dict:
    """Per queue: the job's chunks waiting in line for a slot, queued on the broker's list,
    running (sent, not finished), and its share of what the queue was sent in the last minute."""
    from evalq.orchestrator import dispatch
    from evalq.orchestrator.broker import Unreadable, message_job

    view = {}
    for q in queues:
        queued = 0
        for raw in r.lrange(q, 0, -1):  # a window's worth at most
            try:
                queued += message_job(raw) == job_id
            except Unreadable:
                continue
        view[q] = {"waiting": dispatch.queued_for(r, job_id, q), "queued": queued,
                   "share_last_minute": round(dispatch.shares(r, q).get(job_id, 0.0), 3),
                   "window": dispatch.window(r, q), "backlog": int(r.get(keys.backlog(q)) or 0)}
    # running: sent and not finished, over the job's stages
    plan = {k.decode(): int(v) for k, v in r.hgetall(keys.plan(job_id)).items() if k.decode().endswith(("total", "sent"))}
    finished = sum(r.scard(keys.chunks_done(job_id, s)) for s in ("generate", "metrics") if f"{s}:total" in plan)
    waiting = sum(v["waiting"] for v in view.values())
    queued = sum(v["queued"] for v in view.values())
    in_line = sum(v for k, v in plan.items() if k.endswith(":sent"))  # chunks put in line so far
    return {"queues": view, "chunks": {"waiting": waiting, "queued": queued,
                                       "running": max(0, in_line - finished - waiting - queued)}}


def _sched(row: dict) -> str:
    s = row.get("scheduling") or {}
    return f"{s.get('priority', 'normal'):<6} {s.get('tenant', 'default')}:{s.get('weight', 1):g}"


def recent(r: redis.Redis, limit: int = 20) -> list[dict]:
    """The most recently submitted jobs, newest first (expired ones are forgotten)."""
    rows = []
    for raw_id, at in r.zrevrange(keys.JOBS, 0, limit * 2, withscores=True):
        job_id = raw_id.decode()
        status = status_of(r, job_id)
        if not status:
            r.zrem(keys.JOBS, job_id)
            continue
        spec = load_job(r, job_id)
        rows.append({"job_id": job_id, "status": status, "submitted": time.strftime(
            "%Y-%m-%d %H:%M:%S", time.localtime(at)), "source": spec.source if spec else None,
            "n_instances": spec.n_instances if spec else None, "scheduling": spec.scheduling if spec else None})
        if len(rows) == limit:
            break
    return rows


def render(info, one: bool) -> str:
    if not one:
        if not info:
            return "no jobs"
        return "\n".join(f"{row['job_id']}  {row['status']:<10} {row['submitted']}  {_sched(row)}  {row['source']}"
                         f" ({row['n_instances']} instances)" for row in info)
    lines = [f"job {info['job_id']}: {info['status']}"]
    for err in info.get("errors", []):
        lines.append(f"  error: {err}")
    if "error" in info:
        lines.append(f"  error: {info['error']}")
    if "entries" not in info:
        return "\n".join(lines)
    lines.append(f"  source: {info['source']}  out: {info.get('out')}")
    items = info["items"]
    eta = info.get("eta_s")
    lines.append(f"  items: {items['done']}/{items['total']}"
                 + (f"  rate: {info['rate_items_per_s']}/s" if "rate_items_per_s" in info else "")
                 + (f"  eta: {eta} s ({info.get('eta_stage')}, the slowest stage)" if eta is not None else ""))
    for row in info["entries"]:
        judge = row.get("judge")
        extra = (f"  calls {judge.get('calls', 0)}, tokens {judge.get('prompt_tokens', 0)}+"
                 f"{judge.get('completion_tokens', 0)}, 429s {judge.get('rate_limited', 0)}"
                 + (f", cost {judge['cost']}" if "cost" in judge else "")) if judge else ""
        lines.append(f"  {row['entry']:<24} {row['done']}/{row['total']}{extra}")
        for region, r in (judge or {}).get("regions", {}).items():
            lines.append(f"    {region:<22} calls {r.get('calls', 0)}, tokens {r.get('prompt_tokens', 0)}+"
                         f"{r.get('completion_tokens', 0)}, 429s {r.get('rate_limited', 0)}, "
                         f"failed {r.get('failed_calls', 0)}" + (f", cost {r['cost']}" if "cost" in r else ""))
    for stage, s in info.get("stages", {}).items():
        lines.append(f"  stage {stage}: {s['finished']}/{s['chunks']} chunks finished, {s['sent']} sent")
    sched = info.get("scheduling") or {}
    lines.append(f"  scheduling: priority {sched.get('priority')}, tenant {sched.get('tenant')}, "
                 f"weight {sched.get('weight', 1):g}")
    chunks = (info.get("dispatch") or {}).get("chunks")
    if chunks:
        lines.append(f"  chunks: {chunks['waiting']} waiting in line, {chunks['queued']} queued, "
                     f"{chunks['running']} running")
    for q, v in ((info.get("dispatch") or {}).get("queues") or {}).items():
        lines.append(f"    {q:<22} waiting {v['waiting']}, queued {v['queued']}, share of the last minute "
                     f"{100 * v['share_last_minute']:.0f}%, window {v['window']}, backlog {v['backlog']}")
    if info["queues"]:
        lines.append("  queues: " + ", ".join(f"{q} {n}" for q, n in info["queues"].items()))
    batch = info.get("batch")
    if batch:
        lines.append(f"  batch: {batch['waiting_lines']} line(s) waiting for a reply, {batch['parked_chunks']} "
                     f"chunk(s) parked, {batch['sent_sync']} line(s) sent synchronously instead")
        for b in batch["batches"]:
            lines.append(f"    {b['id']:<34} {b['region']:<10} {b['state']:<11} lines {b['completed']}/{b['lines']}"
                         + (f", failed {b['failed']}" if b["failed"] else "")
                         + (f", expected end {b['expected_end']}" if b.get("expected_end") else ""))
    steps = info.get("recovery") or {}
    if steps.get("resumes"):
        lines.append(f"  recovery: unfinished chunks re-sent {steps['resumes']} time(s), last at {steps['last_resume']}"
                     " (messages lost; see RELIABILITY.md)")
    for stage, at in steps.get("callbacks_resent", {}).items():
        lines.append(f"  recovery: the {stage} stage's callback re-sent at {at}")
    return "\n".join(lines)


def resend_exports(r: redis.Redis, job_id: str) -> dict[str, dict]:
    """``evalq resend``: the ended job's scores its sinks did not take, sent again once each
    (``evalq.results.sinks.resend``); per sink, what it has of each entry now. InfraError for a job
    that runs (its chunks and its final callback send its scores) or whose keys expired."""
    import evalq.shared.job.catalogue  # noqa: F401  (every metric a job may name: an entry's kind)
    from evalq.results.sinks import resend

    status = status_of(r, job_id)
    spec = load_job(r, job_id)
    if not status or spec is None:
        raise InfraError(f"job {job_id}: no such job (expired or never submitted): its scores are gone from Redis")
    if status not in FINAL:
        raise InfraError(f"job {job_id}: still {status}; its scores are sent as its chunks end and at its end")
    return resend(r, job_id, spec)
