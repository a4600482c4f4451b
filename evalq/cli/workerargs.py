"""Celery worker arguments per queue kind: the pool and prefetch that suit it."""

from __future__ import annotations

import os

from evalq.shared.core.config import (CONTROL_QUEUE, GPU_CPUS_ENV, GPU_PROCESSES_ENV, JOBS_QUEUE, env_number,
                                      is_request_queue, tenant_queue)

JUDGE_THREADS = 16  # concurrent judge calls per worker process
LOCAL_GPU_PROCESSES = 2  # `evalq run`'s gpu worker, where the machine has the cores (BENCHMARKS.md)


def cpu_count() -> int:
    """The CPUs this process may run on (a container's share, where the system says it)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def local_gpu_processes() -> int:
    """``evalq run``'s gpu worker: ``EVALQ_GPU_PROCESSES`` where set, else two processes on a
    machine with two CPUs or more: while one process does its host-side work (tokenizing, matching
    in Python, records), the other keeps the device (or the other core) busy."""
    return int(env_number(GPU_PROCESSES_ENV, 0)) or min(LOCAL_GPU_PROCESSES, cpu_count())


def gpu_environment(processes: int, env: dict[str, str] | None = None) -> dict[str, str]:
    """What a gpu worker of ``processes`` pool processes sets for them before the pool starts:
    their number (the read-ahead of a single process is off among several:
    ``evalq.workers.prefetch``), and, unless set already, each one's share of the CPUs for torch's
    threads (``OMP_NUM_THREADS``), so that the processes do not fight over the cores."""
    env = os.environ if env is None else env
    out = {GPU_PROCESSES_ENV: str(processes)}
    if processes > 1 and not env.get("OMP_NUM_THREADS"):
        out["OMP_NUM_THREADS"] = str(max(1, cpu_count() // processes))
        out[GPU_CPUS_ENV] = str(cpu_count())  # lent to the processes scoring (evalq.workers.cores)
    return out


def node_name(queues: list[str], pid: int | None = None) -> str:
    """A worker's node name where ``--hostname`` does not give one: ``evalq-<queue kinds>-<pid>@%h``
    (Celery expands ``%h`` to the host), unique on its host. Celery's own default, ``celery@<host>``,
    is the same for every worker of a host, and the replies of workers that share a name are merged
    into one: the docs' three workers on one host read as one (issue 74)."""
    kinds = sorted({q.split(".", 1)[0] for q in queues if q}) or ["worker"]
    return f"evalq-{'-'.join(kinds)}-{os.getpid() if pid is None else pid}@%h"


def worker_argv(queues: list[str], concurrency: int | None = None, pool: str | None = None,
                hostname: str | None = None, loglevel: str = "INFO", control: bool = True,
                gpu_processes: int = 1) -> list[str]:
    # the control and request queues ride along with any pool
    kinds = {q.split(".", 1)[0] for q in queues if q != CONTROL_QUEUE and not is_request_queue(q)} or {"cpu"}
    if pool is None and "gpu" in kinds and gpu_processes > 1:
        # several processes, each with its own model on the same device: prefork children (the
        # parent never imports torch, so none inherits a CUDA context)
        pool, concurrency = "prefork", gpu_processes
    elif pool is None:
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
