"""What every room stands on, grouped by subject, one folder a subject. From the bottom up (each
room imports only rooms below it; ``tests/unit/test_layers.py`` checks it):

- ``core``: errors, strict models, settings, bounds, limits, validation problems;
- ``policy``: what the operator lets jobs reach (endpoints for keys, S3 places, local roots);
- ``judging``: judges, their deployments and the operator's catalogue, tokens, Batch API settings;
- ``scores``: how item records count and aggregate, statistics, agreement with people;
- ``metrics``: the metric registry, evalq's own metrics' parameters and entries, BERTScore models;
- ``cluster``: Redis keys, leases, status, a job's run plan, tenants and windows, telemetry;
- ``agents``: agent runs and conversations (a family of metrics);
- ``traces``: OpenTelemetry spans read as instances, and an item's result as evaluation events;
- ``data``: datasets, instances, storage, job documents, log lines;
- ``model``: the model under test;
- ``fmeval``: fmeval's evaluation algorithms (a family of metrics);
- ``pairwise``: two answers compared by a judge, in both orders (a family of metrics);
- ``store``: the job store, a job's bulk (instances, item records) as Parquet parts outside Redis;
- ``job``: a job read and validated whole, every metric it may name, and the job as the cluster
  stores it (``stored.StoredJob``: read once per process, typed, carrying its stores).

Nothing here imports Celery or metric libraries, nor any other room of evalq: the CLI and the
validator import this package and must stay fast.
"""
