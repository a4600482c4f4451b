"""Celery workers and the pure metric implementations they run.

``evalq.workers.metrics`` holds pure functions (no Celery, Redis or network); the
Celery app lives in ``evalq.orchestrator.app`` and is imported only by worker processes and
the orchestrator's submit path.
"""
