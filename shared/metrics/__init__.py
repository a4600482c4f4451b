"""The registry of metrics (``registry``: one ``MetricSpec`` per metric), the typed parameters of
evalq's own metrics (``params``), BERTScore's model, layer and baseline resolution (``bertscore``)
and the registry entries of evalq's own metrics (``builtin``). Families of metrics (fmeval's
algorithms, agents) have rooms of their own beside this one.

May import: core, policy, judging. (``tests/unit/test_layers.py`` holds every room of ``evalq.shared`` to
its list.)
"""
