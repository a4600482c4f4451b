"""Looking after running jobs, so that a lost message never leaves one stuck.

A stage's chunks and callbacks are messages, and a message can be lost between
Redis and a worker (the broker killed while a worker pops it, or restarted
without persistence). Two checks find that from what Redis holds:

- every item of the current stage is recorded, but the stage's callback has
  not finished ``callback_grace`` seconds later, is not running (a running callback
  holds a lease it renews, ``evalq.orchestrator.stages.callback_lease``) and does not
  wait in its queue: the callback is sent again (callbacks are idempotent, and two
  copies never run side by side);
- no item has finished for ``resume_after`` seconds and nothing of the job is
  queued or unacknowledged: the stage's unfinished chunks are sent again
  (``resume_job``: a finished chunk is not, and a judge item already recorded
  pays no second call). Once per point of progress: a resume that does not
  help (no worker consumes the queue, say) is not repeated until items finish.

Two lookers share this: a client waiting on its job (``evalq run``, ``evalq
wait``) and the sweeper that every worker of the ``evalq.jobs`` queue runs.
They keep one record per job in Redis (``evalq:{J}:watch``) and claim each
step there, so a step is taken once however many look; and a job whose
submitter died (or never waited: a queue request, ``evalq submit``) is looked
after all the same.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import redis

from evalq.orchestrator.broker import busy_jobs, out_counts
from evalq.orchestrator.stages import callback_running, fire_callback
from evalq.shared.cluster import keys
from evalq.shared.core.config import CONTROL_QUEUE, Settings
from evalq.shared.core.errors import InfraError
from evalq.shared.cluster.spec import current_stage, job_queues, run_keys, stage_items, stage_runs
from evalq.shared.job.stored import StoredJob, as_stored, load_job
from evalq.shared.cluster.status import FINAL, status_of

log = logging.getLogger("evalq.sweeper")

# Set field ARGV[1] of hash KEYS[1] to ARGV[2] unless it holds that value already:
# 1 for the one caller that changed it, 0 for everyone else.
_CLAIM = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
"""


@dataclass(frozen=True)
class Timing:
    callback_grace: float  # seconds a complete stage may wait for its callback
    resume_after: float  # seconds without progress, with nothing queued or running, before a resume

    @classmethod
    def from_env(cls) -> "Timing":
        s = Settings.from_env()
        return cls(callback_grace=s.callback_grace, resume_after=s.resume_after)


def items_done(r: redis.Redis, job_id: str, metric_keys: list[str]) -> dict[str, int]:
    pipe = r.pipeline(transaction=False)
    for m in metric_keys:
        pipe.get(keys.recorded_total(job_id, m))
    return {m: int(n or 0) for m, n in zip(metric_keys, pipe.execute())}


def server_time(r: redis.Redis) -> float:
    """Redis's clock: every looker, on whatever machine, measures against the same one."""
    seconds, micros = r.time()
    return seconds + micros / 1e6


def look_after(r: redis.Redis, broker_url: str, job_id: str, spec: StoredJob | dict, status: str,
               counts: dict[str, int], timing: Timing, now: float | None = None,
               refill: bool = True) -> list[str]:
    """One look at a running job: records its progress and takes the step it needs,
    if any. Returns what was done, as sentences for a log. ``refill``: fill its queues when
    it stalls (the sweep has just filled every queue, so it passes False)."""
    from evalq.orchestrator.app import client_app

    spec = as_stored(spec, job_id)
    now = server_time(r) if now is None else now
    key, ttl = keys.watch(job_id), spec.ttl
    # progress: the items recorded, and those kept by chunks still running (a judge chunk of a
    # thousand items lands once, minutes after its first item was judged: it is not stuck meanwhile)
    done = sum(counts.values()) + kept_items(r, job_id, spec)
    seen = {k.decode(): v.decode() for k, v in r.hgetall(key).items()}
    if seen.get("done") != str(done):
        pipe = r.pipeline(transaction=False)
        pipe.hset(key, mapping={"done": done, "changed_at": now})
        pipe.expire(key, ttl)
        pipe.execute()
        seen.update(done=str(done), changed_at=str(now))
    actions: list[str] = []
    stage = current_stage(spec, status)
    if sum(counts[k] for k, _ in stage_runs(spec, stage)) >= stage_items(spec, stage):
        if r.hsetnx(key, f"complete:{stage}", now):
            r.expire(key, ttl)
        since = float(r.hget(key, f"complete:{stage}") or now)
        if (now - since > timing.callback_grace and f"nudged:{stage}" not in seen  # (looked for once)
                and not callback_running(r, job_id, stage)
                and job_id not in busy_jobs(r, {CONTROL_QUEUE}, {job_id}, unacked=False)
                and r.hsetnx(key, f"nudged:{stage}", now)):
            fire_callback(client_app(broker_url), r, job_id, stage, force=True)
            actions.append(f"job {job_id}: every item of the {stage} stage is recorded but its callback has "
                           "neither run nor started (a worker was lost at the wrong moment); sent it again")
    idle_for = now - float(seen["changed_at"])
    if refill and idle_for > timing.callback_grace:
        # chunks waiting in line while nothing moves: a refill may have been lost with a worker
        from evalq.orchestrator import dispatch

        dispatch.refill_all(client_app(broker_url), r, lambda queues: out_counts(r, queues), job_queues(spec))
    if (idle_for > timing.resume_after and seen.get("resumed_at") != str(done) and idle(r, spec, job_id)
            and r.eval(_CLAIM, 1, key, "resumed_at", str(done), str(ttl))):
        outcome = resume_job(r, broker_url, job_id)
        pipe = r.pipeline(transaction=False)
        pipe.hincrby(key, "resumes", 1)
        pipe.hset(key, "last_resume", now)
        pipe.execute()
        actions.append(f"job {job_id}: no progress for {idle_for:.0f} s with nothing queued or running; "
                       f"re-sent {outcome['sent']} unfinished chunk(s)"
                       + (" and the stage's callback" if outcome["callback"] and not outcome.get("callback_running")
                          else ""))
    return actions


def kept_items(r: redis.Redis, job_id: str, spec: StoredJob) -> int:
    """Items that judge (or generation) chunks still running have scored and kept (``evalq.workers.
    keeping``): not yet recorded, but progress."""
    return sum(kept_by_run(r, job_id, spec).values())


def kept_by_run(r: redis.Redis, job_id: str, spec: StoredJob | dict) -> dict[str, int]:
    """``kept_items`` per run key."""
    names = run_keys(spec)
    pipe = r.pipeline(transaction=False)
    for key in names:
        pipe.hlen(keys.kept(job_id, key))
    return {key: int(n) for key, n in zip(names, pipe.execute())}


def resume_job(r: redis.Redis, broker_url: str, job_id: str) -> dict:
    """Re-send what a running job is missing: after a broker restart that lost
    queued tasks, or a callback that never ran.

    The chunks of the current stage that have not finished are sent again
    (a chunk's finish is recorded in Redis, so the plan says which); finished
    chunks are not, and a judge chunk sent again skips the items it already
    recorded, so no judge call is paid twice. A stage whose chunks have all
    finished gets its callback again (callbacks are idempotent).
    """
    from evalq.orchestrator.app import client_app
    from evalq.orchestrator.stages import CALLBACKS, send_stage, stage_complete

    status = status_of(r, job_id)
    if not status:
        raise InfraError(f"job {job_id}: no such job (expired or never submitted)")
    if status in FINAL:
        return {"job_id": job_id, "status": status, "stage": None, "sent": 0, "callback": None}
    spec = load_job(r, job_id)
    if spec is None:
        raise InfraError(f"job {job_id}: its spec is gone from Redis; it cannot be resumed")
    from evalq.orchestrator.rebuild import reconcile

    reconcile(r, spec)  # a Redis behind the store (a failover lost its last writes): parts are done
    app = client_app(broker_url)
    stage = current_stage(spec, status)
    if stage_complete(r, job_id, stage):
        sent = fire_callback(app, r, job_id, stage, force=True)  # not while it runs
        return {"job_id": job_id, "status": status, "stage": stage, "sent": 0, "callback": CALLBACKS[stage],
                "callback_running": not sent}
    sent = send_stage(app, r, job_id, spec, stage, skip_done=True)
    return {"job_id": job_id, "status": status, "stage": stage, "sent": sent, "callback": None}


def recovery(r: redis.Redis, job_id: str) -> dict | None:
    """The steps the lookers-after took for a job (for ``evalq status``), or None."""
    from datetime import datetime, timezone

    seen = {k.decode(): v.decode() for k, v in r.hgetall(keys.watch(job_id)).items()}

    def when(t: str) -> str:
        return datetime.fromtimestamp(float(t), timezone.utc).isoformat(timespec="seconds")

    out: dict = {}
    if "resumes" in seen:
        out["resumes"] = int(seen["resumes"])
        out["last_resume"] = when(seen["last_resume"])
    callbacks = {k.split(":", 1)[1]: when(v) for k, v in seen.items() if k.startswith("nudged:")}
    if callbacks:
        out["callbacks_resent"] = callbacks
    return out or None


def idle(r: redis.Redis, spec: dict, job_id: str) -> bool:
    """Nothing of the job waits in line for a slot (``evalq.orchestrator.dispatch``), for a
    provider batch (``evalq.orchestrator.parking``), in its queues, or unacknowledged with a worker."""
    from evalq.orchestrator.parking import waits_for_batches

    queues = job_queues(spec)
    if any(r.llen(keys.pending(job_id, q)) for q in queues):
        return False  # waiting its turn, not lost: the sweep's refill sends it
    if waits_for_batches(r, job_id):
        return False  # its chunks wait for provider batches (the batch manager wakes them)
    return job_id not in busy_jobs(r, queues, {job_id})


def sweep(r: redis.Redis, broker_url: str, timing: Timing, now: float | None = None) -> list[str]:
    """Look after every running job once (those submitted within the result TTL), after rebuilding
    from the job store those Redis has lost (``evalq.orchestrator.rebuild``)."""
    from evalq.orchestrator.rebuild import rebuild_lost

    from evalq.orchestrator.spend import keep_spend

    rebuilt = rebuild_lost(r, broker_url) + keep_spend(r)
    now = server_time(r) if now is None else now
    ids = [j.decode() for j in r.zrangebyscore(keys.JOBS, now - Settings.from_env().result_ttl, "+inf")]
    pipe = r.pipeline(transaction=False)
    for job_id in ids:
        pipe.get(keys.status(job_id))
    running = [(j, s.decode()) for j, s in zip(ids, pipe.execute()) if s is not None and s.decode() not in FINAL]
    actions: list[str] = list(rebuilt)
    from evalq.orchestrator import dispatch
    from evalq.orchestrator.app import client_app

    dispatch.refill_all(client_app(broker_url), r, lambda queues: out_counts(r, queues))
    for job_id, status in running:
        spec = load_job(r, job_id)
        if spec is None:
            continue  # expired since
        try:
            actions += look_after(r, broker_url, job_id, spec, status, items_done(r, job_id, run_keys(spec)),
                                  timing, now, refill=False)
        except redis.RedisError:
            raise  # the broker is away: this sweep ends, the next one tries again
        except Exception as exc:  # one job's trouble does not stop the others being looked after
            log.warning("job %s: could not be looked after: %s: %s", job_id, type(exc).__name__, exc)
    return actions


class Sweeper(threading.Thread):
    """Every ``interval`` seconds, one sweep of the cluster's running jobs. Every worker
    of ``evalq.jobs`` runs one; a lock in Redis lets one of them sweep per interval."""

    def __init__(self, broker_url: str, interval: float, name: str, timing: Timing | None = None):
        super().__init__(name="evalq-sweeper", daemon=True)
        self.broker_url, self.interval, self.owner = broker_url, interval, name
        self.timing = timing or Timing.from_env()
        self.stopped = threading.Event()

    def run(self) -> None:
        from evalq.shared.core.config import redis_client

        from evalq.orchestrator import dispatch, holding
        from evalq.orchestrator.app import client_app

        from evalq.shared.store.place import store_root

        r = redis_client(self.broker_url, socket_timeout=30)
        log.info("sweeper: looking after running jobs every %.1f s", self.interval)
        if store_root() is None:
            log.warning("sweeper: no job store (EVALQ_STORE): a running job whose state Redis loses (flushed, "
                        "restarted without persistence, failed over) cannot be rebuilt; set EVALQ_STORE "
                        "(docs/how-to/cluster.md)")
        next_sweep = time.monotonic() + self.interval
        while True:
            # between sweeps, it wakes when a job held off a queue may go again (evalq.orchestrator.holding)
            try:
                due = holding.next_due(r)
            except redis.RedisError:
                due = None
            wait = next_sweep - time.monotonic()
            if due is not None:
                wait = min(wait, due + 0.01)
            if self.stopped.wait(max(0.0, wait)):
                return
            try:
                dispatch.release_holds(client_app(self.broker_url), r)
                if time.monotonic() < next_sweep:
                    continue
                next_sweep = time.monotonic() + self.interval
                if r.set(keys.SWEEP_LOCK, self.owner, nx=True, px=max(1, int(self.interval * 900))):
                    for action in sweep(r, self.broker_url, self.timing):
                        log.warning("sweeper: %s", action)
            except redis.RedisError as exc:
                next_sweep = time.monotonic() + self.interval
                log.info("sweeper: Redis unavailable (%s); trying again in %.1f s", exc, self.interval)
            except Exception:  # noqa: BLE001 - the thread must outlive any one bad sweep
                next_sweep = time.monotonic() + self.interval
                log.exception("sweeper: a sweep failed")

    def stop(self) -> None:
        self.stopped.set()
