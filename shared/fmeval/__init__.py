"""fmeval's evaluation algorithms (aws/fmeval ``src/fmeval/eval_algorithms/``) as evalq metrics:
their parameters (``params``), their registry entries (``catalogue``) and the job-level
aggregation classification needs (``classification``). The implementations are in
``evalq.workers.fmeval``. Names, parameters, defaults and score names are fmeval's, so an
fmeval user finds what they know; where a value differs docs/how-to/fmeval.md says why.

May import: core, policy, judging, scores, metrics, model. (``tests/unit/test_layers.py`` holds it to this list.)
"""
