"""NLTK without the parts evalq never calls, imported in a third of the time.

``import nltk`` (which ``nltk.tokenize``, ``nltk.translate`` and rouge-score's stemmer all run first)
imports every NLTK subpackage, and some of those import scipy.stats, scikit-learn and through it
pandas when they are installed: 1.9 s of a worker's first lexical chunk on this project's 2-core
machine (``python -X importtime``), paid again in every pool process, for collocation statistics
(``fisher_exact``), a scikit-learn classifier wrapper and a transition parser evalq never uses. NLTK
imports each of those optionally (``try: ... except ImportError``), so they are hidden while NLTK
is imported: NLTK then takes about 0.4 s, and every function evalq calls (tokenizers, BLEU, METEOR,
WordNet, the Porter stemmer) is the same code. scipy, scikit-learn and pandas stay importable by
anything else afterwards; only NLTK's three wrappers named above lack them (they would raise if
called).

The hiding holds the interpreter's import lock, so no other thread of the process imports one of
those libraries (and is refused) in the meantime.
"""

from __future__ import annotations

import sys

# the optional imports of nltk.metrics.association, nltk.classify.scikitlearn and
# nltk.parse.transitionparser (scipy.sparse): heavy, and never on evalq's path through NLTK
HIDDEN = ("scipy", "sklearn", "pandas")


def import_nltk() -> None:
    """Import NLTK (once per process) with ``HIDDEN`` out of sight, unless they are imported
    already (then hiding them would save nothing)."""
    if "nltk" in sys.modules:
        return
    import _imp

    _imp.acquire_lock()
    try:
        hidden = [name for name in HIDDEN if name not in sys.modules]
        for name in hidden:
            sys.modules[name] = None  # `import name` raises ImportError while this is there
        try:
            import nltk  # noqa: F401
        finally:
            for name in hidden:
                if name in sys.modules and sys.modules[name] is None:
                    del sys.modules[name]
    finally:
        _imp.release_lock()
