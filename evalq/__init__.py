"""evalq: distributed evaluation of LLM applications on Celery and Redis.

One import name for the repository's rooms (docs/concepts/how-work-flows.md):
``evalq.cli`` (the ``evalq`` command: the client), ``evalq.orchestrator`` (the
job's life in the cluster: requests, stages, the final callback, the sweeper),
``evalq.workers`` (scoring chunks: metrics, the judge client), ``evalq.shared``
(what all stand on: the job schema, the metric registry, the stored spec, keys)
and ``evalq.sim`` (a simulated OpenAI-compatible judge server).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("evalq")
except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
    __version__ = "0+unknown"
