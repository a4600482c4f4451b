"""Celery worker arguments per queue kind: the pool and prefetch that suit it."""

from __future__ import annotations

import os

from evalq.shared.core.config import CONTROL_QUEUE, JOBS_QUEUE, is_request_queue, tenant_queue

JUDGE_THREADS = 16  # concurrent judge calls per worker process


def worker_argv(queues: list[str], concurrency: int | None = None, pool: str | None = None,
                hostname: str | None = None, loglevel: str = "INFO", control: bool = True) -> list[str]:
    # the control and request queues ride along with any pool
    kinds = {q.split(".", 1)[0] for q in queues if q != CONTROL_QUEUE and not is_request_queue(q)} or {"cpu"}
    if pool is None:
        # gpu: one process holds the model and the device; cpu: one process per
        # core; judge and generate: threads, since their tasks mostly wait on HTTP.
        pool = "solo" if "gpu" in kinds else "threads" if kinds <= {"judge", "generate"} else "prefork"
    if pool == "solo":
        # solo runs one task at a time whatever -c says, and Celery prefetches
        # concurrency x multiplier messages: a higher -c would only make one
        # gpu worker hoard chunks that another GPU could be scoring.
        concurrency = 1
    elif concurrency is None:
        concurrency = JUDGE_THREADS if pool == "threads" else os.cpu_count() or 1
    consumed = list(queues) + ([CONTROL_QUEUE] if control and CONTROL_QUEUE not in queues else [])
    if JOBS_QUEUE in queues:  # the jobs role also takes each listed tenant's own request queue
        from evalq.shared.cluster.scheduling import Tenants

        consumed += [tenant_queue(t) for t in Tenants.from_env().names if tenant_queue(t) not in consumed]
    argv = ["worker", "-Q", ",".join(consumed), "-P", pool, "-c", str(concurrency),
            "-l", loglevel, "-E",
            # mingle and gossip sync state between workers at start-up; evalq
            # needs neither, and skipping them makes a worker ready in ~1 s.
            "--without-mingle", "--without-gossip"]
    if hostname:
        argv += ["-n", hostname]
    return argv
