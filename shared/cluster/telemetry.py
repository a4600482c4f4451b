"""Prometheus metrics of a worker node, served on ``/metrics`` when ``EVALQ_METRICS_PORT`` is set.

Names and labels (``deployment`` is a deployment's region name, which also names its queue
``judge.<region>``):

    evalq_items_scored_total{metric,queue}        items recorded with a result
    evalq_item_errors_total{metric}               items recorded with an error
    evalq_items_skipped_total{metric}             items recorded as skipped (token or cost cap, ...)
    evalq_judge_calls_total{deployment}           paid calls (judges and the model under test)
    evalq_judge_tokens_total{deployment,kind}     kind "prompt" | "completion"
    evalq_judge_rate_limited_total{deployment}    429s seen
    evalq_judge_cache_hits_total{deployment}      replies not paid for: "cache" (the Redis judge
                                                  cache), "reuse" (a reply the job already had)
    evalq_judge_cost_total{deployment}            money, in the currency of the prices
    evalq_judge_batch_lines_total{deployment,outcome}  Batch API lines: "answered" (also counted in
                                                  the calls, tokens and cost above), "failed" (sent again)
    evalq_budget_tokens_admitted_total{deployment}  tokens reserved at admission by the cluster budget
    evalq_budget_tpm{deployment}, evalq_budget_rpm{deployment}   the deployment's limits in force (gauges;
                                            learned ones, "auto", as a worker last read them)
    evalq_concurrency_limit{deployment}     an adaptive deployment's learned limit of calls in flight
    evalq_requests_refused_total{queue,reason}    messages on a request queue that were not requests
                                                  (``evalq.orchestrator.intake``): reason "canvas",
                                                  "not_a_request", "arguments" or "unreadable"

The ``metric`` label is the metric id (``generate`` for the generation stage). A counter
counts what this node's processes did since the node started; summed over the nodes it
is what results.json reports for the same work (a chunk scored twice, after its worker
was lost, counts twice: its items were scored twice).

Multiprocess: a prefork pool scores in child processes, which the one HTTP server of
the node does not share memory with. So the node's main process (``evalq worker``)
calls ``prepare`` before anything imports prometheus_client: a fresh private directory
(``tempfile.mkdtemp``, removed at exit; one left by a node that was killed is removed by the
next node started on the machine) named by ``PROMETHEUS_MULTIPROC_DIR``, inherited
by every pool child, where prometheus_client keeps each process's values in files; the
server sums them (``MultiProcessCollector``). Counters of a child that exits stay in
its files; ``process_exit`` (Celery's ``worker_process_shutdown``) drops its live-gauge
files. Threads and solo pools count in the main process, through the same files.

Off (``EVALQ_METRICS_PORT`` unset or 0, or a process that is no prepared node's): every
function here returns at once and prometheus_client is never imported.
"""

from __future__ import annotations

import atexit
import glob
import logging
import os
import shutil
import socket
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterable

log = logging.getLogger("evalq.metrics")

PORT_ENV = "EVALQ_METRICS_PORT"
HOST_ENV = "EVALQ_METRICS_HOST"
DEFAULT_HOST = "0.0.0.0"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# the directory this node made, so that a stray PROMETHEUS_MULTIPROC_DIR of some other
# program never turns counting on in a process that is no worker
NODE_DIR_ENV = "EVALQ_METRICS_NODE_DIR"

CACHE = "cache"   # deployment label of replies from the Redis judge cache
REUSE = "reuse"   # ... and of replies the job already had (kept by an earlier run, or memo)


def port() -> int:
    """``EVALQ_METRICS_PORT`` (0: no metrics)."""
    from evalq.shared.core.config import env_number

    return int(env_number(PORT_ENV, 0))


def prepare() -> str:
    """In a worker node's main process, before prometheus_client is imported: a fresh
    private directory for the values of the node's processes. Returns its path."""
    if "prometheus_client" in sys.modules and os.environ.get(NODE_DIR_ENV) is None:
        raise RuntimeError("prometheus_client was imported before the metrics directory was set: "
                           "its values would not be shared by the pool's processes")
    owner = os.getpid()
    remove_dead_nodes()
    path = tempfile.mkdtemp(prefix=f"{_prefix()}{owner}-")
    os.environ[MULTIPROC_ENV] = os.environ[NODE_DIR_ENV] = path

    def remove() -> None:
        if os.getpid() == owner:  # a forked child runs its parent's atexit hooks too
            shutil.rmtree(path, ignore_errors=True)

    atexit.register(remove)
    return path


def _prefix() -> str:
    return f"evalq-metrics-{socket.gethostname()}-"


def remove_dead_nodes() -> None:
    """Remove the directories of this machine's nodes that died without cleaning up (killed:
    an embedded run's workers are, when it ends)."""
    prefix = _prefix()
    for path in Path(tempfile.gettempdir()).glob(f"{glob.escape(prefix)}*-*"):
        pid = path.name[len(prefix):].split("-", 1)[0]
        if not pid.isdigit() or path.stat().st_uid != os.getuid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass  # alive, someone else's


def enabled() -> bool:
    """A process of a node that ``prepare`` set up (the main process, or a pool child)."""
    node_dir = os.environ.get(NODE_DIR_ENV)
    return bool(node_dir) and os.environ.get(MULTIPROC_ENV) == node_dir


class _Metrics:
    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge

        def counter(name: str, doc: str, labels: tuple[str, ...]) -> Any:
            return Counter(name, doc, labels, registry=None)

        self.items_scored = counter("evalq_items_scored", "Items recorded with a result", ("metric", "queue"))
        self.item_errors = counter("evalq_item_errors", "Items recorded with an error", ("metric",))
        self.items_skipped = counter("evalq_items_skipped", "Items recorded as skipped", ("metric",))
        self.calls = counter("evalq_judge_calls", "Paid calls to a deployment", ("deployment",))
        self.tokens = counter("evalq_judge_tokens", "Tokens of paid calls", ("deployment", "kind"))
        self.rate_limited = counter("evalq_judge_rate_limited", "429 replies", ("deployment",))
        self.cache_hits = counter("evalq_judge_cache_hits", "Replies not paid for", ("deployment",))
        self.cost = counter("evalq_judge_cost", "Money spent (currency of the prices)", ("deployment",))
        self.batch_lines = counter("evalq_judge_batch_lines", "Batch API lines answered or failed",
                                   ("deployment", "outcome"))
        self.admitted = counter("evalq_budget_tokens_admitted", "Tokens reserved at admission",
                                ("deployment",))
        self.refused = counter("evalq_requests_refused", "Messages on a request queue that were not requests",
                               ("queue", "reason"))
        self.exported = counter("evalq_scores_exported", "Evaluation events a sink took or refused",
                                ("sink", "outcome"))
        # the most recent value any process set, also after that process exited
        self.tpm = Gauge("evalq_budget_tpm", "The deployment's tokens per minute", ("deployment",),
                         registry=None, multiprocess_mode="mostrecent")
        self.rpm = Gauge("evalq_budget_rpm", "The deployment's requests per minute", ("deployment",),
                         registry=None, multiprocess_mode="mostrecent")
        self.concurrency = Gauge("evalq_concurrency_limit", "An adaptive deployment's learned limit of calls in "
                                 "flight", ("deployment",), registry=None, multiprocess_mode="mostrecent")
        # JudgeClient._count's fields -> (counter, fixed labels after the deployment, scale)
        self.judge_fields = {"calls": (self.calls, (), 1), "rate_limited": (self.rate_limited, (), 1),
                             "prompt_tokens": (self.tokens, ("prompt",), 1),
                             "completion_tokens": (self.tokens, ("completion",), 1),
                             "cost_nano": (self.cost, (), 1e-9),
                             "batch_calls": (self.batch_lines, ("answered",), 1),
                             "batch_failed_lines": (self.batch_lines, ("failed",), 1)}


_lock = threading.Lock()
_made: list[_Metrics] = []


def _metrics() -> _Metrics | None:
    if _made:
        return _made[0]
    if not enabled():
        return None
    with _lock:
        if not _made:
            _made.append(_Metrics())
    return _made[0]


# -- what the worker counts -------------------------------------------------------------------

def request_refused(queue: str, reason: str) -> None:
    """A message on request queue ``queue`` was refused before Celery saw it (``reason``: a word
    of ``evalq.orchestrator.intake``'s; queues are the operator's tenants', so the series are few)."""
    m = _metrics()
    if m is not None:
        m.refused.labels(queue, reason).inc()


def scores_exported(sink: str, outcome: str, events: int) -> None:
    """``events`` evaluations a sink (``otlp``, or a name of ``EVALQ_SINKS``) took (``sent``) or did not:
    ``refused`` by its backend, ``unreachable`` (no backend answered)."""
    m = _metrics()
    if m is not None and events:
        m.exported.labels(sink, outcome).inc(events)


def items_recorded(metric: str, queue: str | None, records: Iterable[dict]) -> None:
    """A chunk's records, just written to Redis: each counts by its outcome, as the
    aggregators count them (``evalq.shared.scores.results.outcome``)."""
    m = _metrics()
    if m is None:
        return
    from collections import Counter

    from evalq.shared.scores.results import ERROR, SCORED, SKIPPED, outcome

    counts = Counter(outcome(record) for record in records)
    scored, errors, skipped = counts[SCORED], counts[ERROR], counts[SKIPPED]
    if scored:
        m.items_scored.labels(metric, queue or "").inc(scored)
    if errors:
        m.item_errors.labels(metric).inc(errors)
    if skipped:
        m.items_skipped.labels(metric).inc(skipped)


def judge_counted(region: str | None, fields: dict[str, int | float]) -> None:
    """What a judge client adds to a job's accounting (``region`` None: a reply not paid for)."""
    m = _metrics()
    if m is None:
        return
    if region is None:
        for name, label in (("cache_hits", CACHE), ("reused", REUSE)):
            if fields.get(name):
                m.cache_hits.labels(label).inc(fields[name])
        return
    for name, value in fields.items():
        target = m.judge_fields.get(name)
        if target is not None and value:
            counter, labels, scale = target
            counter.labels(region, *labels).inc(value * scale)


def budget_admitted(region: str, tokens: int) -> None:
    m = _metrics()
    if m is not None and tokens:
        m.admitted.labels(region).inc(tokens)


def deployment_limits(limits: Iterable[tuple[str, Any, Any]]) -> None:
    """(region, tpm, rpm) of each deployment a client was made for; a limit that is not a number (an
    ``auto`` one, whose learner sets it as it reads it, or none stated) is left as it is."""
    m = _metrics()
    if m is None:
        return
    for region, tpm, rpm in limits:
        for gauge, value in ((m.tpm, tpm), (m.rpm, rpm)):
            if isinstance(value, int) and not isinstance(value, bool):
                gauge.labels(region).set(value)


def concurrency_limit(region: str, limit: int) -> None:
    """An adaptive deployment's limit of calls in flight, as a worker last saw it."""
    m = _metrics()
    if m is not None:
        m.concurrency.labels(region).set(limit)


def process_exit(pid: int | None = None, **_: Any) -> None:
    """A pool child exits (Celery's ``worker_process_shutdown``): its live gauges go;
    its counters stay in its files and keep counting in the node's sums."""
    if enabled():
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid or os.getpid())


# -- the node's HTTP server -------------------------------------------------------------------

def serve(collectors: Iterable[Any] = ()) -> Any | None:
    """Serve ``/metrics`` (the node's processes' values, and ``collectors``, asked at each
    scrape) on ``EVALQ_METRICS_HOST`` (0.0.0.0) : ``EVALQ_METRICS_PORT``, from a daemon
    thread of this process. Returns the server, or None when off or the port is taken
    (logged: metrics never stop a worker)."""
    if not enabled():
        return None
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    for collector in collectors:
        registry.register(collector)
    host = os.environ.get(HOST_ENV) or DEFAULT_HOST
    try:
        server, _ = start_http_server(port(), host, registry)
    except OSError as exc:
        log.error("metrics: cannot serve on %s:%d: %s", host, port(), exc)
        return None
    log.info("metrics: serving /metrics on %s:%d", host, port())
    return server
