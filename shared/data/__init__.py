"""A job's instances and where they come from: datasets, data configs and presets (``dataset``),
checking and spooling instances (``instances``), local and S3 storage with its bounded readers
(``storage``), reading a large file with every core (``parallel_read``), job documents
(``documents``) and the lines of ``log.jsonl`` (``loglines``).

May import: core, policy, cluster, agents, traces. (``tests/unit/test_layers.py`` holds every room of ``evalq.shared`` to
its list.)
"""
