"""Run one validated job end to end, on a given cluster or an embedded one."""

from __future__ import annotations

import contextlib
import json
import shlex
import sys

from evalq.cli import wait as waiting
from evalq.cli.outage import Outage
from evalq.cli.progress import progress as shown_progress
from evalq.shared.core.errors import InfraError
from evalq.shared.job.schema import Job
from evalq.shared.data.storage import Destination
from evalq.shared.cluster.status import Status


def run_job(job: Job, out: Destination | str, broker: str | None = None, chunk_size: int | None = None,
            concurrency: int | None = None, stall_timeout: float | None = 900.0,
            progress: bool = True, gpu_processes: int | None = None) -> list[dict]:
    """Submit the job and wait for it; the cluster's final callback writes the outputs.

    Killing this process does not stop a job on a given broker: it finishes
    and its files still appear (``evalq status``/``wait`` follow it).
    """
    from evalq.orchestrator import submit
    from evalq.cli.embedded import EmbeddedCluster
    from evalq.shared.job.stored import stored_job

    dest = out if isinstance(out, Destination) else Destination(str(out))
    dest.check()  # an unwritable destination is found before any work is done
    with contextlib.ExitStack() as stack:
        store = submit.FROM_ENV
        if broker:
            broker_url, check = broker, (lambda: None)
        else:
            store = _embedded_store(stack)
            cluster = stack.enter_context(EmbeddedCluster(
                job.queues, concurrency=concurrency, env=_embedded_env(job, dest),
                gpu_processes=gpu_processes or embedded_gpu_processes(job, chunk_size),
                cpu_processes=embedded_cpu_processes(job, chunk_size)))
            broker_url, check = cluster.broker_url, cluster.check
        r = waiting.connect(broker_url)
        if broker:
            _warn_missing_workers(broker_url, job.queues)
        job_id = submit.submit(r, broker_url, job, chunk_size, out=dest, store=store)
        # what the cluster counts: the variants' runs too (they made `make demo` show 36/30 items)
        total = waiting.items_of(stored_job(r, job_id))
        bar = stack.enter_context(shown_progress(total, enabled=progress))
        outage = Outage(broker_url, stall_timeout or 300)  # Redis away: ride it out, as long as a stall
        interrupted = False
        try:
            status = waiting.wait(r, broker_url, job_id, on_progress=bar, check=check,
                                 stall_timeout=stall_timeout, outage=outage, on_eta=bar.eta)
            bar(total)
            return outage.call(finished, r, job_id, status)
        except KeyboardInterrupt:  # Ctrl-C, SIGTERM: nothing more is asked of Redis here
            interrupted = True     # (its stop keeps only what outlives a job)
            raise
        finally:
            if not broker and not interrupted:
                # the private Redis keeps only what outlives a job (judge cache, budgets)
                submit.delete_job(r, job_id, [m.key for m in job.runs])


def embedded_cpu_processes(job: Job, chunk_size: int | None = None) -> int:
    """Embedded mode's cpu worker pool: a process per CPU, but no more than the job has cpu chunks
    (a job of a few instances has one: a second pool process would only start, import the metrics
    and wait; issue 76)."""
    from evalq.cli.workerargs import cpu_count

    return max(1, min(cpu_count(), _chunks(job, "cpu", chunk_size)))


PLANNED_UP_TO = 20_000  # instances of a job whose chunks are counted from its plan before it starts


def _chunks(job: Job, kind: str, chunk_size: int | None) -> int:
    """How many chunks the job's stages send to queues of ``kind`` (the plan ``evalq validate`` shows:
    entries scored together are one chunk); a large job, which has more than any machine's cores,
    is not planned twice for it."""
    from evalq.orchestrator.submit import chunks_of, outline, run_entry

    if len(job.instances) > PLANNED_UP_TO:
        return sum(-(-job.span(m) // run_entry(m, chunk_size, job.span(m))["chunk_size"])
                   for m in job.runs if m.kind == kind)
    return sum(1 for c in chunks_of(outline(job, chunk_size, runs=job.runs)) if c.queue.split(".", 1)[0] == kind)


def embedded_gpu_processes(job: Job, chunk_size: int | None = None) -> int:
    """Embedded mode's gpu processes unless the user says: ``evalq run``'s default
    (``local_gpu_processes``), but no more than the job has gpu chunks; a process no chunk comes
    to would only load the job's models beside the one that scores."""
    from evalq.cli.workerargs import local_gpu_processes

    return max(1, min(local_gpu_processes(), _chunks(job, "gpu", chunk_size)))


def _embedded_store(stack: contextlib.ExitStack):
    """Where an embedded run stages its instances: the operator's store where one is named
    (``EVALQ_STORE``: its parts stay, as a cluster's), else a folder of its own, removed when
    the run ends (after its workers stopped: the stack unwinds in reverse)."""
    import shutil
    import tempfile

    from evalq.orchestrator import submit
    from evalq.shared.store.place import Place, store_root

    if store_root() is not None:
        return submit.FROM_ENV
    folder = tempfile.mkdtemp(prefix="evalq-store-")
    stack.callback(shutil.rmtree, folder, ignore_errors=True)
    return Place(folder)


def _embedded_env(job: Job, dest: Destination) -> dict[str, str]:
    """Embedded mode: the user is the operator, so without lists of their own
    (``EVALQ_ENDPOINTS``, ``EVALQ_S3_ENDPOINTS``, ``EVALQ_S3_PREFIXES``) the workers
    may send keys to the endpoints the job names and reach the S3 places it names."""
    import os

    from evalq.shared.policy.egress import job_places
    from evalq.shared.policy.endpoints import ENV, job_endpoints

    from evalq.shared.judging.deployments import INLINE_ENV

    configs = list(job.judges.values()) + ([job.model] if hasattr(job.model, "deployments") else [])
    env = {ENV: job_endpoints(configs), INLINE_ENV: "shared"}  # the user's own cluster: its own deployments
    from evalq.shared.job.preload import ENV as PRELOAD_ENV, setting

    if preload := setting(job.metrics):  # the workers load the job's models while it is submitted
        env[PRELOAD_ENV] = preload
    places = job_places(job, dest.uri)
    if dest.endpoint_url:
        places["EVALQ_S3_ENDPOINTS"] = ",".join(filter(None, [places["EVALQ_S3_ENDPOINTS"],
                                                               dest.endpoint_url.rstrip("/")]))
    env.update(places)
    return {k: v for k, v in env.items() if k not in os.environ}


def finished(r, job_id: str, status: str) -> list[dict]:
    """The results of a job that ended; InfraError when it failed or was cancelled."""
    from evalq.shared.cluster import keys

    if status == Status.FAILED:
        error = (r.get(keys.error(job_id)) or b"unknown error").decode()
        raise InfraError(f"job {job_id} failed: {error}")
    if status == Status.CANCELLED:
        raise InfraError(f"job {job_id} was cancelled; partial outputs were written")
    summary = json.loads(r.get(keys.summary(job_id)))
    from evalq.results.sinks import exports_total

    for sink, got in (exports_total(summary) or {}).items():  # never lost in silence
        if got["unsent"]:
            print(f"evalq: {got['unsent']} items' scores were not sent to {sink} {got['endpoint']}"
                  f"{': ' + got['answer'] if got.get('answer') else ''} (run.json: exports)", file=sys.stderr)
    from evalq.shared.judging.retirement import gathered, said

    for found in gathered(m.get("judge") for m in summary):  # before it breaks a night
        print(f"evalq: warning: {said(found)}", file=sys.stderr)
    compared = json.loads(r.get(keys.compared(job_id)) or "{}")
    moved = compared.get("dataset") or {}
    if moved.get("baseline") and moved.get("compared_on") != "same version" or moved.get("pinned"):
        from evalq.results.dataset_versions import dataset_line

        print(f"evalq: dataset: {dataset_line(moved)}", file=sys.stderr)  # a moved dataset, said before it misleads
    regressed = sum(len(m.get("regressions") or []) for m in summary)
    if regressed:  # said where the night is watched, not only in the history store
        from evalq.shared.job.stored import load_job

        suite = getattr(load_job(r, job_id), "series", None) or "SUITE"
        print(f"evalq: {regressed} regression(s) against the suite's baseline (evalq history {shlex.quote(suite)} "
              "lists them; results.json: regressions)", file=sys.stderr)
    return summary


def _warn_missing_workers(broker_url: str, queues: list[str]) -> None:
    """In cluster mode, say so when no worker consumes a queue the job needs."""
    from evalq.orchestrator.app import client_app

    app = client_app(broker_url)
    try:
        # every reply on its own (inspect() merges them by node name: workers sharing one, as
        # Celery's default celery@<host> makes them, would read as one)
        replies = app.control.broadcast("active_queues", reply=True, timeout=1.0) or []
    except Exception as exc:  # inspection is advisory only
        from evalq.shared.core.config import safe_url

        raise InfraError(f"cannot inspect workers on {safe_url(broker_url)}: {exc}") from None
    from collections import Counter

    answering = Counter(name for reply in replies for name in reply)
    shared = sorted(name for name, n in answering.items() if n > 1)
    if shared:
        print(f"evalq: {', '.join(f'{answering[n]} workers answer as {n}' for n in shared)}: give each its own "
              "name (evalq worker --hostname NAME@%h), or Celery's control and Flower mix them up", file=sys.stderr)
    consumed = {q["name"] for reply in replies for qs in reply.values() for q in (qs or [])}
    missing = [q for q in queues if q not in consumed]
    if missing:
        print(f"evalq: no worker is consuming {', '.join(missing)} yet; tasks wait on the queue "
              f"(start one with: evalq worker --queues {','.join(missing)})", file=sys.stderr)
