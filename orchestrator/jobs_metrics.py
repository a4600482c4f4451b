"""The jobs role's gauges, computed from Redis and the history store at each scrape of its
``/metrics`` (``evalq.shared.telemetry`` serves them beside the worker counters):

    evalq_jobs{status}                      jobs per status, of those Redis still holds
                                            (ended ones until EVALQ_RESULT_TTL expires them)
    evalq_jobs_stalled                      running jobs with no item finished for
                                            EVALQ_STALL_SECONDS (default 900)
    evalq_queue_backlog{queue}              chunks planned and not finished per work queue
                                            (``evalq.orchestrator.backlog``)
    evalq_suite_value{suite,metric,name,field}   the headline values of each suite's last done run
    evalq_suite_regressions{suite}          regressions found in that run
    evalq_suite_last_run_timestamp_seconds{suite,status}   when the suite's last run (any status) ended
    evalq_suite_cost{suite}                 that run's cost (absent when no price was given)

A job's last progress is what the lookers-after record (``evalq.orchestrator.watch``):
the items done at their last look and when that count changed; a job whose count has
moved since is progressing, and one never looked at counts from its submission.

A scrape never fails for want of Redis or the database: each of the three sources that
fails is logged once (until it answers again) and left out of that scrape.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from typing import Any, Callable, Iterator

import redis

from evalq.orchestrator.backlog import backlogs
from evalq.orchestrator.watch import items_done, server_time
from evalq.shared import keys
from evalq.shared.config import env_number
from evalq.shared.spec import run_keys
from evalq.shared.status import FINAL, Status

log = logging.getLogger("evalq.metrics")

STALL_ENV = "EVALQ_STALL_SECONDS"
DEFAULT_STALL_SECONDS = 900


def stalled(r: redis.Redis, job_id: str, now: float, stall_seconds: float) -> bool:
    """No item of the running job has finished for ``stall_seconds`` (Redis server time)."""
    raw = r.get(keys.spec(job_id))
    if raw is None:
        return False  # expired since
    spec = json.loads(raw)
    done = sum(items_done(r, job_id, run_keys(spec)).values())
    seen = {k.decode(): v.decode() for k, v in r.hgetall(keys.watch(job_id)).items()}
    if "changed_at" in seen:
        if seen.get("done") != str(done):
            return False  # items finished since the last look
        since = float(seen["changed_at"])
    elif done == 0 and spec.get("submitted_at"):
        since = _epoch(spec["submitted_at"])
    else:
        return False  # never looked at, and moving
    if now - since <= stall_seconds:
        return False
    from evalq.orchestrator.parking import waits_for_batches

    return not waits_for_batches(r, job_id)  # waiting for provider batches is slow, not stalled


def job_counts(r: redis.Redis, stall_seconds: float) -> tuple[dict[str, int], int]:
    """(jobs per status, running jobs stalled), over the jobs Redis holds."""
    ids = [j.decode() for j in r.zrange(keys.JOBS, 0, -1)]
    pipe = r.pipeline(transaction=False)
    for job_id in ids:
        pipe.get(keys.status(job_id))
    counts = {s.value: 0 for s in Status}
    running = []
    for job_id, raw in zip(ids, pipe.execute()):
        if raw is None:
            continue  # expired
        status = raw.decode()
        counts[status] = counts.get(status, 0) + 1
        if status not in FINAL:
            running.append(job_id)
    now = server_time(r)
    return counts, sum(stalled(r, job_id, now, stall_seconds) for job_id in running)


def suite_rows(latest: list[dict], done: dict[str, dict] | None = None) -> dict[str, list[tuple[tuple[str, ...], float]]]:
    """The suite gauges' samples: of each suite's last run (``latest``) its end time and cost,
    and of its last done run (``done``, by suite; default: those of ``latest`` that are done)
    its headline values and regressions."""
    if done is None:
        done = {row["suite"]: row for row in latest if row.get("status") == Status.DONE}
    out: dict[str, list[tuple[tuple[str, ...], float]]] = {
        "value": [], "regressions": [], "last_run_timestamp_seconds": [], "cost": []}
    for row in latest:
        suite = str(row["suite"])
        if row.get("finished_at"):
            out["last_run_timestamp_seconds"].append(((suite, str(row.get("status") or "")),
                                                      _epoch(row["finished_at"])))
        if isinstance(row.get("cost"), (int, float)):
            out["cost"].append(((suite,), float(row["cost"])))
    for suite, row in done.items():
        for m in row.get("metrics") or []:
            if isinstance(m.get("value"), (int, float)):
                out["value"].append(((str(suite), str(m["metric"]), str(m.get("name") or m["metric"]),
                                      str(m.get("field") or "")), float(m["value"])))
        out["regressions"].append(((str(suite),), float(len(row.get("regressions") or []))))
    return out


SUITE_LABELS = {"value": ("suite", "metric", "name", "field"), "regressions": ("suite",),
                "last_run_timestamp_seconds": ("suite", "status"), "cost": ("suite",)}
SUITE_HELP = {"value": "Headline value of the suite's last run", "regressions": "Regressions in the suite's last run",
              "last_run_timestamp_seconds": "End time of the suite's last run", "cost": "Cost of the suite's last run"}


class JobsCollector:
    """A prometheus_client collector (``collect`` runs at each scrape)."""

    def __init__(self, r: redis.Redis, stall_seconds: float | None = None,
                 open_store: Callable[[], Any] | None = None):
        self.r = r
        self.stall_seconds = float(env_number(STALL_ENV, DEFAULT_STALL_SECONDS) if stall_seconds is None
                                   else stall_seconds)
        self.open_store = open_store
        self.store: Any = None
        self.failing: set[str] = set()

    def describe(self) -> list:
        return []  # nothing is asked of Redis when the collector is registered

    def collect(self) -> Iterator[Any]:
        for source, families in (("jobs", self._jobs), ("backlog", self._backlog), ("history", self._suites)):
            yield from self._guarded(source, families)

    def _guarded(self, source: str, families: Callable[[], list]) -> list:
        try:
            made = families()
        except Exception as exc:  # noqa: BLE001 - a scrape yields what it can
            if source not in self.failing:
                self.failing.add(source)
                log.warning("metrics: %s left out of the scrape: %s: %s", source, type(exc).__name__, exc)
            return []
        if source in self.failing:
            self.failing.discard(source)
            log.warning("metrics: %s is back in the scrape", source)
        return made

    def _jobs(self) -> list:
        from prometheus_client.core import GaugeMetricFamily

        counts, stuck = job_counts(self.r, self.stall_seconds)
        jobs = GaugeMetricFamily("evalq_jobs", "Jobs per status", labels=["status"])
        for status, n in sorted(counts.items()):
            jobs.add_metric([status], n)
        return [jobs, GaugeMetricFamily("evalq_jobs_stalled", "Running jobs with no item finished for "
                                        f"{STALL_ENV} seconds", value=stuck)]

    def _backlog(self) -> list:
        from prometheus_client.core import GaugeMetricFamily

        family = GaugeMetricFamily("evalq_queue_backlog", "Chunks planned and not finished", labels=["queue"])
        for queue, n in backlogs(self.r).items():
            family.add_metric([queue], n)
        return [family]

    def _suites(self) -> list:
        from prometheus_client.core import GaugeMetricFamily

        if self.store is None:
            self.store = (self.open_store or _history_store)()
        if self.store is False:
            return []  # EVALQ_HISTORY=off
        # a suite whose last run failed or was cancelled shows the values of its last done one
        done = {row["suite"]: row for row in self.store.latest(Status.DONE)}
        rows = suite_rows(self.store.latest(), done)
        families = []
        for kind, samples in rows.items():
            family = GaugeMetricFamily(f"evalq_suite_{kind}", SUITE_HELP[kind], labels=list(SUITE_LABELS[kind]))
            for labels, value in samples:
                family.add_metric(list(labels), value)
            families.append(family)
        return families


def _history_store() -> Any:
    """The store (opened once: its engine pools connections), or False when history is off."""
    from evalq.orchestrator.history import history_url, open_store

    return open_store() if history_url() is not None else False


def _epoch(iso: str) -> float:
    at = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    return (at if at.tzinfo else at.replace(tzinfo=timezone.utc)).timestamp()
