"""Scoring chunks: the ``evalq.score_chunk`` task, the chunk runner, the metric
implementations (pure functions in ``evalq.workers.metrics``: no Celery, Redis or network)
and the judge client. A finished chunk calls ``evalq.orchestrator.stages.chunk_finished``.
"""
