"""Pairwise comparison of two answers by a judge (issue 61): a family of its own.

An instance carries two answers to the same input, the candidate's (``actual-output``) and the
baseline's (``baseline-output``): two models, two prompts, tonight's run and last night's. The
judge is asked which is better in both orders (the candidate shown first, then the baseline first),
so a judge that prefers a seat measures that preference, not the models: an item whose two verdicts
disagree is a tie (or as ``disagreement`` says), never a silent win for the first seat. The
aggregate (``aggregate``) reports win, tie and loss rates with intervals and the judge's biases:
the first position's win rate, the flip rate under the swap and the longer answer's win rate.

May import: core, judging, scores, metrics. (``tests/unit/test_layers.py`` holds it to this list.)
"""
