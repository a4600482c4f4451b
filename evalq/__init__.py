"""evalq: distributed evaluation of LLM applications on Celery and Redis.

The repository's top-level folders install under this one name:
``evalq.orchestrator`` (validation, submission, outputs, the CLI),
``evalq.workers`` (the Celery app, its tasks and the pure metric functions),
``evalq.shared`` (job schema, metric registry, parameters, keys: the layer both
stand on) and ``evalq.sim`` (a simulated OpenAI-compatible judge server).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("evalq")
except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
    __version__ = "0+unknown"
