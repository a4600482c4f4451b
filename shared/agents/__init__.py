"""Agents: instances that carry an agent's run as OpenAI chat messages (assistant ``tool_calls``,
``tool`` results), the tools it had (``tool_definitions``) and the reference trajectory
(``expected_tool_calls``). Reading and validating them (``trajectory``), parameters and registry
entries; the metrics are in ``evalq.workers.agents``.

May import: core, judging, metrics. (``tests/unit/test_layers.py`` holds it to this list.)
"""
