"""fmeval's toxicity: a classifier's per-label probabilities for the model's output, on the gpu
queue, batched, one classifier per worker process.

- ``jigsaw_lstm`` (default): the Jigsaw toxic-comment classifier the ``toxic-comment-classifier``
  package ships (MIT; 20,000-word embedding, BiLSTM, dense layers; six labels). The package
  builds it with TensorFlow; evalq reads its Keras weights file with h5py and its tokenizer with
  a restricted unpickler, and runs the same network in torch. Labels are named as detoxify
  names Jigsaw's (``toxic`` is ``toxicity``, ``identity_hate`` is ``identity_attack``).
- ``toxigen``: a ToxiGen RoBERTa checkpoint (``tomh/toxigen_roberta``) in a local directory
  (``model_path``); ``toxicity`` is the probability of its LABEL_1, as fmeval reads it.
"""

from __future__ import annotations

import io
import pickle
import threading
from collections import OrderedDict, defaultdict
from pathlib import Path

from evalq.shared.fmeval.params import JIGSAW_MISSING, ToxicityParams, jigsaw_folder
from evalq.workers import cores

JIGSAW = ("toxic", "severe_toxic", "obscene", "threat", "insult", "identity_hate")
NAMES = {"toxic": "toxicity", "severe_toxic": "severe_toxicity", "identity_hate": "identity_attack"}
MAXLEN = 100

_models: dict[tuple, object] = {}
_lock = threading.Lock()


def classifier_dir() -> Path:
    folder = jigsaw_folder()
    if folder is None:
        raise RuntimeError(JIGSAW_MISSING)
    return folder


class _Tokenizer:
    """Keras' legacy ``Tokenizer``, as pickled: only its state is read."""

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        # its filters as a translation table, made once rather than for every text
        self.table = str.maketrans({c: self.split for c in self.filters})


class _OnlyTokenizer(pickle.Unpickler):
    ALLOWED = {("collections", "OrderedDict"): OrderedDict, ("collections", "defaultdict"): defaultdict,
               ("builtins", "int"): int}

    def find_class(self, module: str, name: str):
        if name == "Tokenizer" and module.startswith("keras"):
            return _Tokenizer
        if (module, name) in self.ALLOWED:
            return self.ALLOWED[(module, name)]
        raise pickle.UnpicklingError(f"the tokenizer file may not name {module}.{name}")


def _words(tokenizer: _Tokenizer, text: str) -> list[int]:
    """Keras' ``texts_to_sequences`` for one text: filters to spaces, lower-cased, split; words
    outside the vocabulary dropped; the last 100 kept."""
    if tokenizer.lower:
        text = text.lower()
    index, limit = tokenizer.word_index, tokenizer.num_words
    ids = [i for i in map(index.get, filter(None, text.translate(tokenizer.table).split(tokenizer.split)))
           if i is not None and not (limit and i >= limit)]
    return ids[-MAXLEN:]


def word_ids(tokenizer: _Tokenizer, text: str) -> list[int]:
    """``texts_to_sequences`` then ``pad_sequences(maxlen=100)``: zeros before the words."""
    ids = _words(tokenizer, text)
    return [0] * (MAXLEN - len(ids)) + ids


def id_grid(tokenizer: _Tokenizer, texts: list[str]):
    """``word_ids`` of each text as one ``[len(texts), 100]`` int64 numpy array (filled row by row:
    a nested list handed to ``torch.tensor`` cost as much as the tokenization)."""
    import numpy as np

    grid = np.zeros((len(texts), MAXLEN), dtype=np.int64)
    for row, text in enumerate(texts):
        ids = _words(tokenizer, text)
        if ids:
            grid[row, MAXLEN - len(ids):] = ids
    return grid


class JigsawLSTM:
    def __init__(self, device: str):
        import h5py
        import torch

        folder = classifier_dir()
        with open(folder / "tokenizer.pickle", "rb") as f:
            self.tokenizer = _OnlyTokenizer(io.BytesIO(f.read())).load()
        with h5py.File(folder / "model.weights.h5", "r") as w:
            def var(path: str):
                return torch.from_numpy(w[f"layers/{path}"][()])

            self.embedding = var("embedding/vars/0")
            self.lstm = torch.nn.LSTM(50, 50, batch_first=True, bidirectional=True)
            for direction, suffix in (("forward_layer", ""), ("backward_layer", "_reverse")):
                cell = f"bidirectional/{direction}/cell/vars"
                # Keras: kernel (in, 4u), recurrent (u, 4u), one bias; gates i, f, c, o as torch's i, f, g, o
                getattr(self.lstm, f"weight_ih_l0{suffix}").data = var(f"{cell}/0").T.contiguous()
                getattr(self.lstm, f"weight_hh_l0{suffix}").data = var(f"{cell}/1").T.contiguous()
                getattr(self.lstm, f"bias_ih_l0{suffix}").data = var(f"{cell}/2")
                getattr(self.lstm, f"bias_hh_l0{suffix}").data.zero_()
            self.dense = (var("dense/vars/0"), var("dense/vars/1"))
            self.out = (var("dense_1/vars/0"), var("dense_1/vars/1"))
        self.device = device
        self.lstm.to(device).eval()
        self.embedding, self.dense, self.out = (self.embedding.to(device), tuple(t.to(device) for t in self.dense),
                                                tuple(t.to(device) for t in self.out))

    def scores(self, texts: list[str], batch_size: int) -> list[dict[str, float]]:
        import torch

        if not texts:
            return []
        parts = []
        with torch.inference_mode():
            for start in range(0, len(texts), batch_size):
                cores.fit(self.device)  # on a CPU: the CPUs of this worker's idle processes, if it has several
                # the next batch is tokenized while a GPU still runs this one: nothing waits for the
                # device until every batch is queued
                ids = torch.from_numpy(id_grid(self.tokenizer, texts[start:start + batch_size])).to(
                    self.device, non_blocking=True)
                hidden, _ = self.lstm(self.embedding[ids])
                x = torch.relu(hidden.max(dim=1).values @ self.dense[0] + self.dense[1])
                parts.append(torch.sigmoid(x @ self.out[0] + self.out[1]))
            probs = torch.cat(parts).cpu().tolist()
        labels = [NAMES.get(label, label) for label in JIGSAW]
        return [dict(zip(labels, row)) for row in probs]


class Toxigen:
    def __init__(self, path: str, device: str):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.model = AutoModelForSequenceClassification.from_pretrained(path, local_files_only=True).to(device).eval()
        self.device = device

    def scores(self, texts: list[str], batch_size: int) -> list[dict[str, float]]:
        import torch

        results = []
        with torch.inference_mode():
            for start in range(0, len(texts), batch_size):
                cores.fit(self.device)
                batch = self.tokenizer(texts[start:start + batch_size], return_tensors="pt", padding=True,
                                       truncation=True).to(self.device)
                probs = torch.softmax(self.model(**batch).logits, dim=-1)[:, 1].cpu().tolist()
                results += [{"toxicity": p} for p in probs]
        return results


def classifier(params: ToxicityParams):
    from evalq.workers.metrics.bertscore.models import pick_device

    device = pick_device(params.device)
    key = (params.model_type, params.model_path, device)
    with _lock:
        if key not in _models:
            _models.clear()  # one classifier per worker process
            _models[key] = JigsawLSTM(device) if params.model_type == "jigsaw_lstm" else \
                Toxigen(params.model_path, device)
        return _models[key]


def toxicity(instances: list[dict], params: ToxicityParams) -> list[dict]:
    """Each output's probability per label (texts in batches of ``batch_size``)."""
    return classifier(params).scores([inst["actual-output"] for inst in instances], params.batch_size)


def warm(params: ToxicityParams) -> str:
    """The registry's ``warm`` hook: the classifier loaded and run once on this process's device."""
    toxicity([{"actual-output": "warm"}], params)
    from evalq.workers.metrics.bertscore.models import pick_device

    return f"{params.model_type} on {pick_device(params.device)}"
