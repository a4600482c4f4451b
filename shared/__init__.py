"""What every room stands on: the job schema and validation, the metric registry and
catalogue, parameters, the stored spec, result reading and aggregation, keys, settings.

Nothing here imports Celery or metric libraries, nor any other room: the CLI and the
validator import this package and must stay fast.
"""
