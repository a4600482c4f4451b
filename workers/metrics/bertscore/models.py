"""BERTScore's models on a worker: loaded once per process from local directories (never by hub
name), kept for later chunks and jobs (the two most recently used), as bert_score loads them
(``get_model``, ``AutoTokenizer``), or, for a plain BERT, by ``native`` without transformers.
What model, layer and baseline a parameter set means is resolved in
``evalq.shared.metrics.bertscore`` (validation needs it too, without torch).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import OrderedDict
from functools import lru_cache
from pathlib import Path
from typing import Any

# Never reach the network, whatever imports transformers later in this process.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The Rust tokenizer warns when a process forks after using it (Celery's prefork pool does).
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

log = logging.getLogger("evalq.bertscore")

# Models kept loaded per worker process (least recently used is dropped).
MAX_CACHED_MODELS = 2


# --- models (workers) ----------------------------------------------------------

_models: OrderedDict[tuple, tuple[Any, Any]] = OrderedDict()
_tokenizers: dict[tuple[str, bool, bool], Any] = {}
_lock = threading.RLock()
stats = {"model_loads": 0}


def pick_device(requested: str | None) -> str:
    import torch

    if requested is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {requested!r} requested but CUDA is not available on this worker")
    return requested


class _SpecialTokensOnly:
    """bert-score 0.3.13 encodes an empty sentence as
    ``tokenizer.build_inputs_with_special_tokens([])``, which transformers 5
    tokenizers no longer have. This returns what that call returned: the
    special tokens alone, so an empty sentence scores 0 as bert-score documents.
    A class, not a lambda: the idf step pickles the tokenizer into a Pool."""

    def __init__(self, ids: list[int]):
        self.ids = list(ids)

    def __call__(self, token_ids_0, token_ids_1=None):
        if token_ids_0 or token_ids_1:
            raise NotImplementedError("only bert-score's empty-sentence call is supported")
        return list(self.ids)


_ROBERTA_LIKE = {"roberta", "xlm-roberta", "camembert", "longformer", "bart"}


def _fix_tokenizer(tokenizer, path: str) -> Any:
    if not hasattr(tokenizer, "build_inputs_with_special_tokens"):
        tokenizer.build_inputs_with_special_tokens = _SpecialTokensOnly(
            tokenizer("", add_special_tokens=True)["input_ids"])
    # bert-score truncates to tokenizer.model_max_length; a tokenizer that does
    # not know its limit would let a long text overflow the position embeddings.
    try:
        config = json.loads(Path(path, "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    limit = config.get("max_position_embeddings")
    if isinstance(limit, int) and limit > 0:
        limit -= 2 if config.get("model_type") in _ROBERTA_LIKE else 0
        if tokenizer.model_max_length > limit:
            tokenizer.model_max_length = limit
    return tokenizer


def load_tokenizer(path: str, use_fast: bool, native: bool = False) -> Any:
    """``AutoTokenizer``'s, as bert_score's ``get_tokenizer`` loads it from a local directory;
    with ``native``, the same ids from ``tokenizer.json`` without importing transformers
    (``native``: only where ``native_ok`` says so)."""
    with _lock:
        key = (path, use_fast, native)
        if key not in _tokenizers:
            if native:
                from evalq.workers.metrics.bertscore.native import Tokenizer

                tokenizer = Tokenizer(path)
            else:
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(path, use_fast=use_fast)
            _tokenizers[key] = _fix_tokenizer(tokenizer, path)
        return _tokenizers[key]


@lru_cache(maxsize=32)
def _unsupported(path: str, switch: str | None) -> str | None:
    # ``switch``: EVALQ_BERTSCORE_NATIVE's value, part of the key (the files are read once)
    from evalq.workers.metrics.bertscore.native import unsupported

    return unsupported(path)


def native_ok(path: str, engine: str) -> bool:
    """Whether evalq's engine loads this model and tokenizer without transformers (a plain BERT;
    ``engine: bert_score`` always goes through transformers, as bert_score does)."""
    from evalq.workers.metrics.bertscore.native import ENV

    return engine != "bert_score" and _unsupported(path, os.environ.get(ENV)) is None


def load_model(path: str, num_layers: int, all_layers: bool, use_fast: bool, device: str,
               native: bool = False) -> tuple[Any, Any]:
    """(model, tokenizer), loaded once per process and kept for later chunks and jobs; with
    ``native`` (``native_ok``), built by ``native`` without importing transformers."""
    key = (path, num_layers, all_layers, use_fast, device, native)
    with _lock:
        if key in _models:
            _models.move_to_end(key)
            return _models[key]
        import time

        t0 = time.perf_counter()
        tokenizer = load_tokenizer(path, use_fast, native)
        if native:
            from evalq.workers.metrics.bertscore import native

            model = native.load_model(path, num_layers, all_layers)
        else:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
            model = get_model(path, num_layers, all_layers)
        model.to(device)
        model.eval()
        _models[key] = (model, tokenizer)
        stats["model_loads"] += 1
        log.info("loaded %s (layers=%s%s) on %s in %.1f s", path, num_layers,
                 ", all layers" if all_layers else "", device, time.perf_counter() - t0)
        while len(_models) > MAX_CACHED_MODELS:
            _models.popitem(last=False)
            _free_device_memory()
        return _models[key]


def get_model(path: str, num_layers: int, all_layers: bool) -> Any:
    """``bert_score.utils.get_model`` for a local directory (evalq never loads models by hub
    name): the model in eval mode, an encoder-decoder's encoder, and, unless ``all_layers``, only
    its first ``num_layers`` layers, cut where bert_score cuts each family. Here rather than
    imported: importing ``bert_score`` imports matplotlib and pandas, which the engine never uses
    (a cold ``evalq run`` of a small job: 0.7 s faster without them, the worker 85 MiB smaller).
    tests/unit/test_bertscore_model.py holds it equal to bert_score's on every family."""
    import torch
    from transformers import AutoModel

    if "t5" in path:  # bert_score's test, on the name it is given
        from transformers import T5EncoderModel

        model = T5EncoderModel.from_pretrained(path)
    else:
        model = AutoModel.from_pretrained(path)
    model.eval()
    if hasattr(model, "decoder") and hasattr(model, "encoder"):
        model = model.encoder
    if all_layers:  # every layer's states, flagged where bert_score flags them
        if hasattr(model, "output_hidden_states"):
            model.output_hidden_states = True
        elif hasattr(model, "encoder"):
            model.encoder.output_hidden_states = True
        elif hasattr(model, "transformer"):
            model.transformer.output_hidden_states = True
        return model

    def cut(owner, name: str) -> None:
        layers = getattr(owner, name)
        if not 0 <= num_layers <= len(layers):
            raise ValueError(f"num_layers {num_layers} is out of range: the model has {len(layers)} layers")
        setattr(owner, name, torch.nn.ModuleList(list(layers[:num_layers])))

    if hasattr(model, "n_layers"):  # xlm
        if not 0 <= num_layers <= model.n_layers:
            raise ValueError(f"num_layers {num_layers} is out of range: the model has {model.n_layers} layers")
        model.n_layers = num_layers
    elif hasattr(model, "layer"):  # xlnet
        cut(model, "layer")
    elif hasattr(model, "encoder"):
        if hasattr(model.encoder, "albert_layer_groups"):
            if not 0 <= num_layers <= model.encoder.config.num_hidden_layers:
                raise ValueError(f"num_layers {num_layers} is out of range: the model has "
                                 f"{model.encoder.config.num_hidden_layers} layers")
            model.encoder.config.num_hidden_layers = num_layers
        elif hasattr(model.encoder, "block"):  # t5
            cut(model.encoder, "block")
        else:  # bert, roberta
            cut(model.encoder, "layer")
    elif hasattr(model, "transformer"):  # distilbert
        cut(model.transformer, "layer")
    elif hasattr(model, "layers"):  # bart's encoder
        cut(model, "layers")
    else:
        raise ValueError(f"bert_score does not know where to cut {type(model).__name__}'s layers")
    return model


def _free_device_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def clear_cache() -> None:
    with _lock:
        _models.clear()
        _tokenizers.clear()
        _free_device_memory()
