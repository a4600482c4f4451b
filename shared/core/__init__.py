"""What every other room stands on: errors (``JobError``, ``MetricError``, ...), the strict base
models of every section and parameter (``Strict``, ``Params``), settings read from ``EVALQ_*``
variables (``config``: queue names, ``Settings``, ``env_number``), bounds on what a job may declare
(``bounds``), input limits (``limits``), located validation problems (``problems``) and text fit for a
terminal (``display``).

May import: nothing else in ``evalq.shared``. (``tests/unit/test_layers.py`` holds every room of ``evalq.shared`` to
its list.)
"""
