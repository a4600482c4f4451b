"""Turning item records into scores: how a record counts and reads (``results``), the
aggregators (``aggregate``), intervals and tests (``stats``) and agreement with human grades
(``agreement``).

May import: core, judging. (``tests/unit/test_layers.py`` holds every room of ``evalq.shared`` to
its list.)
"""
