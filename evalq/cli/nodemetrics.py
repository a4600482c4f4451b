"""What ``evalq worker`` sets up, before Celery starts, for a node's ``/metrics``
(``EVALQ_METRICS_PORT``; ``evalq.shared.cluster.telemetry`` says how the pool's processes share it).

- now, in the main process, before anything imports prometheus_client: the node's
  private directory of values (inherited by every pool child);
- at ``worker_ready`` (the pool is started, so its children do not inherit the server's
  thread half-way): the HTTP server, in the main process; on a worker of ``evalq.jobs``
  with the jobs role's gauges (``evalq.orchestrator.jobs_metrics``) beside the counters.

(A prefork child's exit is seen where every pool child, forked or spawned, has it
connected: ``evalq.workers.tasks``.)
"""

from __future__ import annotations

from evalq.shared.cluster import telemetry
from evalq.shared.core.config import JOBS_QUEUE

_node: dict = {}  # what worker_ready needs: the broker, and whether this is the jobs role


def prepare_node(queues: list[str], broker_url: str) -> bool:
    """Set the node up for metrics when ``EVALQ_METRICS_PORT`` asks for them; True if so."""
    if not telemetry.port():
        return False
    telemetry.prepare()
    from celery.signals import worker_ready

    _node.update(broker_url=broker_url, jobs=JOBS_QUEUE in queues)
    worker_ready.connect(serve_node, weak=False)
    return True


def serve_node(**_) -> None:
    collectors = []
    if _node.get("jobs"):
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        from evalq.orchestrator.jobs_metrics import JobsCollector
        from evalq.shared.core.config import redis_client

        # a scrape while Redis is away answers at once, without Redis's gauges (not after retries)
        r = redis_client(_node["broker_url"], socket_timeout=5, socket_connect_timeout=2, retry=Retry(NoBackoff(), 1))
        collectors.append(JobsCollector(r))
    telemetry.serve(collectors)
