"""A job read and validated whole: its schema and ``parse_job`` (``schema``), its metric entries
resolved against the registry and the judges (``entries``), suites and regression settings
(``nightly``), and every metric a job may name registered in one place (``catalogue``: evalq's own,
each family's, the operator's plugins), and the job as the cluster stores it from submission to
its end (``stored``: one typed ``StoredJob``, read once per process, carrying its instance and
record stores).

May import: core, policy, judging, scores, metrics, cluster, agents, data, model, fmeval, pairwise,
store. (``tests/unit/test_layers.py`` holds every room of ``evalq.shared`` to its list.)
"""
