"""The judges and what they answer on: a judge's configuration and its parameters (``judges``),
its deployments and the operator's catalogue of them (``deployments``), Batch API settings
(``batch_config``), token estimates and bounds (``tokens``), a reply read (``judge_reply``) and
stand-in values of a JSON schema (``schema_values``).

May import: core. (``tests/unit/test_layers.py`` holds every room of ``evalq.shared`` to
its list.)
"""
