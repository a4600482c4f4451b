"""Schemas, the metric registry and configuration shared by the orchestrator and the workers.

Nothing here imports Celery, Redis clients or metric libraries: the CLI and the
validator import this package and must stay fast.
"""
