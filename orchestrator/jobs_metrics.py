"""The jobs role's gauges, computed from Redis and the history store at each scrape of its
``/metrics`` (``evalq.shared.cluster.telemetry`` serves them beside the worker counters):

    evalq_jobs{status}                      jobs per status, of those Redis still holds
                                            (ended ones until EVALQ_RESULT_TTL expires them)
    evalq_jobs_stalled                      running jobs with no item finished for
                                            EVALQ_STALL_SECONDS (default 900)
    evalq_queue_backlog{queue}              chunks planned and not finished per work queue
                                            (``evalq.orchestrator.backlog``)
    evalq_suite_value{suite,tenant,metric,name,field}   the headline values of each suite's last done run
    evalq_suite_regressions{suite,tenant}   regressions found in that run
    evalq_suite_last_run_timestamp_seconds{suite,tenant,status}   when the suite's last run (any status) ended
    evalq_suite_cost{suite,tenant}          that run's cost (absent when no price was given)
(a suite is its tenant's: two tenants' runs of one suite name are two series)
    evalq_suite_series_omitted              suites and value series left out by the bounds below

Jobs name suites and entries, so the suite series are bounded: the ``EVALQ_METRICS_MAX_SUITES``
(100) suites whose last run ended most recently, none whose last run ended more than
``EVALQ_METRICS_SUITE_MAX_AGE`` seconds ago (30 days), and ``EVALQ_METRICS_MAX_SUITE_VALUES`` (50)
value series per suite.

A job's last progress is what the lookers-after record (``evalq.orchestrator.watch``):
the items done at their last look and when that count changed; a job whose count has
moved since is progressing, and one never looked at counts from its submission.

A scrape never fails for want of Redis or the database: each of the three sources that
fails is logged once (until it answers again) and left out of that scrape.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Iterator

import redis

from evalq.orchestrator.backlog import backlogs
from evalq.orchestrator.watch import items_done, server_time
from evalq.shared.cluster import keys
from evalq.shared.core.config import env_number
from evalq.shared.cluster.spec import run_keys
from evalq.shared.job.stored import load_job
from evalq.shared.cluster.status import FINAL, Status

log = logging.getLogger("evalq.metrics")

STALL_ENV = "EVALQ_STALL_SECONDS"
DEFAULT_STALL_SECONDS = 900


def stalled(r: redis.Redis, job_id: str, now: float, stall_seconds: float) -> bool:
    """No item of the running job has finished for ``stall_seconds`` (Redis server time)."""
    spec = load_job(r, job_id)
    if spec is None:
        return False  # expired since
    done = sum(items_done(r, job_id, run_keys(spec)).values())
    seen = {k.decode(): v.decode() for k, v in r.hgetall(keys.watch(job_id)).items()}
    if "changed_at" in seen:
        if seen.get("done") != str(done):
            return False  # items finished since the last look
        since = float(seen["changed_at"])
    elif done == 0 and spec.submitted_at:
        since = spec.submitted_epoch
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


MAX_SUITES_ENV, SUITE_AGE_ENV, MAX_VALUES_ENV = ("EVALQ_METRICS_MAX_SUITES", "EVALQ_METRICS_SUITE_MAX_AGE",
                                                  "EVALQ_METRICS_MAX_SUITE_VALUES")
SUITE_AGE = 30 * 86400  # EVALQ_METRICS_SUITE_MAX_AGE unset


@dataclass(frozen=True)
class SuiteBounds:
    """How many suite series a scrape may carry: jobs name suites and entries, so without a bound
    every message would add series to the operator's Prometheus for ever."""

    max_suites: int = 100        # the suites whose last run ended most recently
    max_age: float = SUITE_AGE  # seconds since a suite's last run after which it is dropped
    max_values: int = 50         # evalq_suite_value series per suite (its entries' fields in job order)

    @classmethod
    def from_env(cls) -> "SuiteBounds":
        return cls(int(env_number(MAX_SUITES_ENV, 100)), float(env_number(SUITE_AGE_ENV, SUITE_AGE)),
                   int(env_number(MAX_VALUES_ENV, 50)))


def suite_key(row: dict) -> tuple[str, str]:
    """A run's series: its suite and its tenant's (a suite is its tenant's)."""
    return str(row["suite"]), str(row.get("tenant") or "")


def suite_rows(latest: list[dict], done: dict[tuple, dict] | None = None, bounds: SuiteBounds = SuiteBounds(),
               now: float | None = None) -> dict[str, list[tuple[tuple[str, ...], float]]]:
    """The suite gauges' samples: of each suite's last run per tenant (``latest``) its end time and
    cost, and of its last done run (``done``, by (suite, tenant); default: those of ``latest`` that
    are done) its headline values and regressions; within ``bounds`` (``omitted``: the series left out).
    A suite is its tenant's: two tenants' runs of one suite name are two series."""
    if done is None:
        done = {suite_key(row): row for row in latest if row.get("status") == Status.DONE}
    now = time.time() if now is None else now
    out: dict[str, list[tuple[tuple[str, ...], float]]] = {
        "value": [], "regressions": [], "last_run_timestamp_seconds": [], "cost": [], "series_omitted": []}
    ended = {suite_key(row): _epoch(row["finished_at"]) if row.get("finished_at") else now for row in latest}
    recent = sorted((s for s, t in ended.items() if now - t <= bounds.max_age), key=lambda s: (-ended[s], s))
    kept = set(recent[:bounds.max_suites])
    omitted = len(ended) - len(kept)
    for row in latest:
        suite = suite_key(row)
        if suite not in kept:
            continue
        if row.get("finished_at"):
            out["last_run_timestamp_seconds"].append(((*suite, str(row.get("status") or "")), ended[suite]))
        if isinstance(row.get("cost"), (int, float)):
            out["cost"].append((suite, float(row["cost"])))
    for suite, row in done.items():
        if suite not in kept:
            continue
        values = [m for m in row.get("metrics") or [] if isinstance(m.get("value"), (int, float))]
        for m in values[:bounds.max_values]:
            out["value"].append(((*suite, str(m["metric"]), str(m.get("name") or m["metric"]),
                                  str(m.get("field") or "")), float(m["value"])))
        omitted += max(0, len(values) - bounds.max_values)
        out["regressions"].append((suite, float(len(row.get("regressions") or []))))
    out["series_omitted"].append(((), float(omitted)))
    return out


SUITE_LABELS = {"value": ("suite", "tenant", "metric", "name", "field"), "regressions": ("suite", "tenant"),
                "last_run_timestamp_seconds": ("suite", "tenant", "status"), "cost": ("suite", "tenant"),
                "series_omitted": ()}
SUITE_HELP = {"value": "Headline value of the suite's last run", "regressions": "Regressions in the suite's last run",
              "last_run_timestamp_seconds": "End time of the suite's last run", "cost": "Cost of the suite's last run",
              "series_omitted": f"Suites, and value series of suites, left out ({MAX_SUITES_ENV}, {SUITE_AGE_ENV}, "
                                f"{MAX_VALUES_ENV})"}


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
        self.bounds = SuiteBounds.from_env()

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
        done = {suite_key(row): row for row in self.store.latest(Status.DONE)}
        rows = suite_rows(self.store.latest(), done, self.bounds)
        families = []
        for kind, samples in rows.items():
            family = GaugeMetricFamily(f"evalq_suite_{kind}", SUITE_HELP[kind], labels=list(SUITE_LABELS[kind]))
            for labels, value in samples:
                family.add_metric(list(labels), value)
            families.append(family)
        return families


def _history_store() -> Any:
    """The store (opened once: its engine pools connections), or False when history is off."""
    from evalq.results.history import history_url, open_store

    return open_store() if history_url() is not None else False


def _epoch(iso: str) -> float:
    at = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    return (at if at.tzinfo else at.replace(tzinfo=timezone.utc)).timestamp()
