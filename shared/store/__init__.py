"""The job store: where a job's bulk lives outside Redis (``EVALQ_STORE``), as Parquet parts.

``place``: a job's folder in the store (a local or shared filesystem, or an ``s3://`` prefix);
``instances``: a job's instances staged there at submission, read back by position;
``records``: a run's item records, a part per chunk (or, without a store, a Redis hash).

May import: core, policy, scores, data, cluster. (``tests/unit/test_layers.py`` holds it to this list.)
"""
