"""The model under test: an endpoint model or a runner class (``runners``: ``ModelRunner``, the
prompt template, the generation stage's registry entry).

May import: core, judging, metrics, cluster, data. (``tests/unit/test_layers.py`` holds every room of ``evalq.shared`` to
its list.)
"""
