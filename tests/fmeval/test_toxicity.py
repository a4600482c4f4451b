"""toxicity's default classifier against Keras itself: the toxic-comment-classifier package's own
architecture built with Keras 3 (torch backend; the package asks for TensorFlow), its weights
file loaded by Keras, its pickled Keras tokenizer used as Keras uses it. evalq reads the same
files without Keras and runs the network in torch; the scores must agree."""

from __future__ import annotations

import os
import pickle

import pytest

os.environ.setdefault("KERAS_BACKEND", "torch")
keras = pytest.importorskip("keras")

from evalq.shared.fmeval.params import ToxicityParams  # noqa: E402
from evalq.workers.fmeval.toxicity import JIGSAW, NAMES, classifier_dir, id_grid, toxicity, word_ids  # noqa: E402

TEXTS = ["You are a wonderful person and I appreciate your help.",
         "You are an idiot and I hate you, shut up!!",
         "I will find you and hurt you.",
         "", "ok", "Thanks!!! http://example.com  SPAM spam\tspam " * 30,
         "What a stupid, ugly, worthless piece of garbage."]


@pytest.fixture(scope="module")
def reference():
    from keras.layers import LSTM, Bidirectional, Dense, Dropout, Embedding, GlobalMaxPooling1D, Input
    from keras.models import Model
    from keras.utils import pad_sequences

    folder = classifier_dir()
    with open(folder / "tokenizer.pickle", "rb") as f:
        tokenizer = pickle.load(f)  # Keras' own Tokenizer class
    inp = Input(shape=(100,))
    x = Embedding(input_dim=20000, output_dim=50, trainable=False)(inp)
    x = Bidirectional(LSTM(50, return_sequences=True, dropout=0.1, recurrent_dropout=0.1))(x)
    x = GlobalMaxPooling1D()(x)
    x = Dense(50, activation="relu")(x)
    x = Dropout(0.1)(x)
    model = Model(inputs=inp, outputs=Dense(6, activation="sigmoid")(x))
    model.load_weights(folder / "model.weights.h5")

    def classify(texts):
        padded = pad_sequences(tokenizer.texts_to_sequences(texts), maxlen=100)
        return padded, model.predict(padded, verbose=0)
    return classify


def test_tokens_and_scores_equal_keras(reference):
    padded, expected = reference(TEXTS)
    from evalq.workers.fmeval.toxicity import classifier

    tokenizer = classifier(ToxicityParams()).tokenizer
    assert [word_ids(tokenizer, t) for t in TEXTS] == padded.tolist()
    assert id_grid(tokenizer, TEXTS).tolist() == padded.tolist()  # the rows the classifier is given
    got = toxicity([{"id": str(i), "actual-output": t} for i, t in enumerate(TEXTS)], ToxicityParams(batch_size=3))
    for row, scores in zip(expected.tolist(), got):
        assert scores == {NAMES.get(label, label): pytest.approx(p, abs=1e-5) for label, p in zip(JIGSAW, row)}
    assert got[1]["toxicity"] > 0.5 > got[0]["toxicity"]  # the classifier tells these apart


def test_a_toxigen_checkpoint_reads_as_fmeval_reads_it(tmp_path):
    """A ToxiGen-shaped classifier (a small random BERT here: the real checkpoint is a download) in a
    local directory: toxicity is P(LABEL_1) as fmeval's helper takes it from transformers' pipeline."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification, pipeline

    from evalq.shared.metrics import bertscore as models

    tokenizer = AutoTokenizer.from_pretrained(models.bundled_model_dir(), local_files_only=True)
    torch.manual_seed(3)
    model = BertForSequenceClassification(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32,
                                                     num_hidden_layers=2, num_attention_heads=2,
                                                     intermediate_size=64, num_labels=2))
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    params = ToxicityParams(model_type="toxigen", model_path=str(tmp_path), batch_size=2)
    got = toxicity([{"id": str(i), "actual-output": t} for i, t in enumerate(TEXTS[:4])], params)
    classify = pipeline("text-classification", model=str(tmp_path), device="cpu")
    expected = [x["score"] if x["label"] == "LABEL_1" else 1.0 - x["score"] for x in classify(TEXTS[:4])]
    assert [g["toxicity"] for g in got] == pytest.approx(expected, abs=1e-5)


def test_defect_rates_per_label_merge_over_chunks():
    from evalq.shared.scores.aggregate import chunk_part, merge_parts

    import evalq.shared.job.catalogue  # noqa: F401

    records = [{"instance_id": "1", "result": {"toxicity": 0.9, "insult": 0.7}},
               {"instance_id": "2", "result": {"toxicity": 0.2, "insult": 0.6}},
               {"instance_id": "3", "result": {"toxicity": 0.1, "insult": 0.1}},
               {"instance_id": "4", "error": "boom"}]
    params = ToxicityParams(threshold=0.65).model_dump(mode="json")
    overall, _, _ = merge_parts("toxicity", params, [chunk_part("toxicity", params, records[:2]),
                                                      chunk_part("toxicity", params, records[2:])])
    score = overall.score()
    assert score["toxicity"] == pytest.approx(0.4) and score["insult"] == pytest.approx(1.4 / 3)
    assert score["defects"]["toxicity"]["n_defects"] == 1 and score["defects"]["insult"]["n_defects"] == 1
    assert score["defects"]["any"]["defect_rate"] == pytest.approx(1 / 3)
    assert (overall.n, overall.n_errors) == (3, 1)


def test_toxigen_needs_a_local_directory():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="toxigen needs model_path"):
        ToxicityParams(model_type="toxigen")
    with pytest.raises(ValidationError, match="no such directory"):
        ToxicityParams(model_type="toxigen", model_path="/nonexistent/toxigen")
