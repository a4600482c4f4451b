"""The client's side of a job on a cluster: connecting to its Redis, and waiting for the
job to end while looking after it as the cluster's sweeper does. Every Redis access of a
waiting client rides out an outage (``evalq.cli.outage``)."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Callable

from evalq.cli.outage import Outage
from evalq.shared.cluster import keys
from evalq.shared.core.errors import InfraError
from evalq.shared.cluster.status import FINAL

if TYPE_CHECKING:  # redis itself is imported when a client connects: `evalq run` starts its
    import redis  # workers first (redis-py imports asyncio and OpenTelemetry, 0.13 s)

QUIET_START = 15.0  # seconds without an item of a job with a model under test before the client says why


def items_of(spec) -> int:
    """Every item a job records, as the cluster counts them: its generation stage's, its variants'
    runs' and its metric entries' (what a progress bar counts up to)."""
    from evalq.shared.cluster.spec import run_items, runs

    return sum(run_items(spec, key, entry) for key, entry in runs(spec))


def connect(broker_url: str, outage: Outage | None = None) -> redis.Redis:
    """A client for the broker's Redis, checked with a ping. A client that waits
    rides out an outage through ``outage`` alone (redis-py's own retries off), so it
    says at once that Redis is unreachable."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from evalq.shared.core.config import redis_client, safe_url

    retries = {"retry": Retry(NoBackoff(), 0)} if outage is not None else {}
    r = redis_client(broker_url, socket_connect_timeout=5, socket_timeout=60, **retries)
    try:
        if outage is not None:
            outage.call(r.ping)
        else:
            r.ping()
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise InfraError(f"cannot reach broker {safe_url(broker_url)}: {exc}") from None
    except redis.ResponseError as exc:
        raise InfraError(f"broker {safe_url(broker_url)} refused: {exc}") from None
    return r


def wait(r: redis.Redis, broker_url: str, job_id: str, on_progress: Callable[[int], None],
         check: Callable[[], None], poll: float = 0.25, stall_timeout: float | None = None,
         outage: Outage | None = None,
         on_eta: Callable[[float | None, str | None], None] | None = None) -> str:
    """Poll until the job reaches a final status (set by its last callback); returns it.

    ``check`` raises InfraError when the workers are gone (embedded mode);
    ``stall_timeout`` bounds how long no item may finish before giving up (a job whose
    chunks wait for provider batches is not stalled).
    While it waits, the client looks after the job as the cluster's sweeper
    does (``evalq.orchestrator.watch``): a stage whose callback was lost gets
    it again, a job whose messages were lost gets its unfinished chunks again.
    Every Redis access rides out an outage (``outage``; by default up to the
    stall timeout, else 300 s), which does not count as a stall. A job whose state Redis lost
    (flushed, restarted without persistence, failed over) is waited for while the cluster's
    sweeper rebuilds it from the job store (``evalq.orchestrator.rebuild``), up to the same bound,
    and the client says so once. ``on_eta`` gets the time left of the job's slowest stage
    (``evalq.orchestrator.eta``) at each look, None while it has no estimate.
    """
    from evalq.orchestrator.eta import Eta, by_stage
    from evalq.orchestrator.parking import waits_for_batches
    from evalq.orchestrator.watch import Timing
    from evalq.orchestrator.rebuild import REBUILT
    from evalq.shared.cluster.spec import has_model_stage
    from evalq.shared.job.stored import load_job

    outage = outage or Outage(broker_url, stall_timeout or 300)
    spec = load_job(r, job_id, get=lambda key: outage.call(r.get, key))
    if spec is None:
        raise InfraError(f"job {job_id}: no such job (expired or never submitted)")
    timing = Timing.from_env()
    last_done, last_change, lost_since = -1, time.monotonic(), None
    loading = time.monotonic() if has_model_stage(spec) else None  # a model run's first chunk loads the model
    rebuilt = outage.call(r.hget, keys.watch(job_id), REBUILT)  # when it was last rebuilt, if ever
    eta = Eta()
    while True:
        going, status, actions = outage.call(_look, r, broker_url, job_id, spec, timing)
        done = sum(going.values())
        if not status:  # Redis lost the job: the sweeper rebuilds it from the job store, if it has one
            if lost_since is None:
                lost_since = time.monotonic()
                print(f"evalq: job {job_id}: the cluster's Redis has lost the job's state; waiting for it to "
                      "be rebuilt from the job store", file=sys.stderr)
            elif time.monotonic() - lost_since > (stall_timeout or 300):
                raise InfraError(f"job {job_id}: its keys are gone from Redis (expired or deleted) and it was not "
                                 "rebuilt (only a cluster with a job store, EVALQ_STORE, rebuilds a running job)")
            check()
            outage.call(_until_ended, r, job_id, poll)
            last_change = time.monotonic()  # no stall meanwhile
            continue
        now_rebuilt = outage.call(r.hget, keys.watch(job_id), REBUILT)
        if lost_since is not None or now_rebuilt != rebuilt:  # (a rebuild quicker than a look: said all at once)
            print(f"evalq: job {job_id}: " + ("" if lost_since is not None else "the cluster's Redis lost the job's "
                  "state; ") + "rebuilt from the job store; going on (the judges' budgets and learned capacity "
                  "start again from the providers' headers, or their floors)", file=sys.stderr)
            lost_since, rebuilt = None, now_rebuilt
        on_progress(done)
        if on_eta is not None:
            on_eta(*eta.update(by_stage(spec, going)))
        if status in FINAL:
            return status
        check()
        for action in actions:
            print(f"evalq: {action}", file=sys.stderr)
        now = time.monotonic()
        last_change = max(last_change, outage.ended_at)  # time Redis was away is no stall
        if not done and loading is not None and now - loading > QUIET_START:  # said once: not a stall
            loading = None
            print(f"evalq: job {job_id}: no item done yet after {QUIET_START:.0f} s: the model under test loads "
                  "on its worker as its first chunk starts", file=sys.stderr)
        if done != last_done:
            last_done, last_change = done, now
        elif stall_timeout and now - last_change > stall_timeout:
            if outage.call(waits_for_batches, r, job_id):  # hours at the provider are no stall
                last_change = now
            else:
                raise InfraError(f"job {job_id}: no progress for {stall_timeout:.0f} s "
                                 f"({done} items done); are workers consuming the job's queues?")
        outage.call(_until_ended, r, job_id, poll)


def _until_ended(r: redis.Redis, job_id: str, poll: float) -> None:
    """Up to ``poll`` seconds, less when the job ends meanwhile: its final callback pushes the
    status onto ``keys.ended``, which this moves onto itself (left there for other waiters)."""
    ended = keys.ended(job_id)
    r.blmove(ended, ended, poll, "RIGHT", "LEFT")


def _look(r: redis.Redis, broker_url: str, job_id: str, spec: dict,
          timing) -> tuple[dict[str, int], str, list[str]]:
    """One look at a job being waited on: (items done per run: recorded, and kept by its chunks still
    running; status; steps taken to look after it)."""
    from evalq.orchestrator.watch import items_done, kept_by_run, look_after
    from evalq.shared.cluster.spec import run_keys

    counts = items_done(r, job_id, run_keys(spec))
    status = (r.get(keys.status(job_id)) or b"").decode()
    if not status or status in FINAL:
        return counts, status, []
    actions = look_after(r, broker_url, job_id, spec, status, counts, timing)
    kept = kept_by_run(r, job_id, spec)
    return {key: n + kept.get(key, 0) for key, n in counts.items()}, status, actions
