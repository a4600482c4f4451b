"""evalq's NLTK import (evalq.workers.nltk_import): the lexical metrics load without scipy,
scikit-learn and pandas, give NLTK's values, and leave those libraries importable."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(code: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, **kw)


def test_lexical_metrics_load_without_scipy_sklearn_and_pandas_and_equal_nltk():
    out = run("""
        import sys
        from evalq.workers.metrics import lexical
        from evalq.shared.metrics.params import BleuParams, RougeParams
        print(sorted(m for m in ("scipy", "sklearn", "pandas") if m in sys.modules))
        inst = {"actual-output": "the cat sat on the mat", "expected-output": ["a cat sat on the mat"]}
        ours = lexical.bleu(inst, BleuParams())
        rouge = lexical.rouge(inst, RougeParams(use_stemmer=True))
        # what NLTK computes with scipy and scikit-learn importable, and rouge-score's stemmer
        import scipy.stats, sklearn, pandas  # still importable
        from nltk.tokenize import wordpunct_tokenize
        from nltk.translate.bleu_score import sentence_bleu
        from rouge_score.rouge_scorer import RougeScorer
        theirs = sentence_bleu([wordpunct_tokenize("a cat sat on the mat")], wordpunct_tokenize("the cat sat on the mat"))
        reference = RougeScorer(["rougeL"], use_stemmer=True).score("a cat sat on the mat", "the cat sat on the mat")
        print(ours == theirs, abs(rouge["rougeL"] - reference["rougeL"].fmeasure) < 1e-12)
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[]", "True True"], out.stdout + out.stderr


def test_the_hiding_holds_the_import_lock_and_ends_with_the_import(tmp_path):
    """Another thread importing scipy meanwhile waits for the lock rather than being refused: the
    stand-in NLTK here says whether the lock is held while it is imported, and what it sees."""
    fake = tmp_path / "nltk"
    fake.mkdir()
    (fake / "__init__.py").write_text(textwrap.dedent("""
        import _imp, sys
        LOCKED = _imp.lock_held()
        try:
            import sklearn
            SEEN = "sklearn imported"
        except ImportError:
            SEEN = "sklearn hidden"
    """))
    out = run(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from evalq.workers.nltk_import import import_nltk
        import_nltk()
        import _imp, nltk
        print(nltk.LOCKED, nltk.SEEN, _imp.lock_held(), "sklearn" in sys.modules)
        import sklearn
        print(sklearn.__name__)
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["True sklearn hidden False False", "sklearn"], out.stdout
