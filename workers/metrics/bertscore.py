"""BERTScore on the gpu queue: evalq's engine (``evalq.workers.metrics.bertscore_engine``, the
default), or the bert-score package's own ``bert_cos_score_idf`` (``engine: bert_score``).

What model, layer and baseline a parameter set means is resolved in
``evalq.shared.metrics.bertscore`` (validation needs it too, without torch). Here: a
per-process model cache, the ``prepare`` hook that computes idf weights once
per job over every reference, and the batch function the runner calls with a
chunk of instances. Models are only ever loaded from local directories.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
from collections import Counter, OrderedDict, defaultdict
from functools import lru_cache
from pathlib import Path
from typing import Any

from evalq.shared.metrics.bertscore import resolve

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
_tokenizers: dict[tuple[str, bool], Any] = {}
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
    (``bertscore_native``: only where ``native_ok`` says so)."""
    with _lock:
        key = (path, use_fast, native)
        if key not in _tokenizers:
            if native:
                from evalq.workers.metrics.bertscore_native import Tokenizer

                tokenizer = Tokenizer(path)
            else:
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(path, use_fast=use_fast)
            _tokenizers[key] = _fix_tokenizer(tokenizer, path)
        return _tokenizers[key]


@lru_cache(maxsize=32)
def _unsupported(path: str, switch: str | None) -> str | None:
    from evalq.workers.metrics.bertscore_native import unsupported

    return unsupported(path)


def native_ok(path: str, engine: str) -> bool:
    """Whether evalq's engine loads this model and tokenizer without transformers (a plain BERT;
    ``engine: bert_score`` always goes through transformers, as bert_score does)."""
    from evalq.workers.metrics.bertscore_native import ENV

    return engine != "bert_score" and _unsupported(path, os.environ.get(ENV)) is None


def load_model(path: str, num_layers: int, all_layers: bool, use_fast: bool, device: str,
               native: bool = False) -> tuple[Any, Any]:
    """(model, tokenizer), loaded once per process and kept for later chunks and jobs; with
    ``native`` (``native_ok``), built by ``bertscore_native`` without importing transformers."""
    key = (path, num_layers, all_layers, use_fast, device, native)
    with _lock:
        if key in _models:
            _models.move_to_end(key)
            return _models[key]
        import time

        t0 = time.perf_counter()
        tokenizer = load_tokenizer(path, use_fast, native)
        if native:
            from evalq.workers.metrics import bertscore_native

            model = bertscore_native.load_model(path, num_layers, all_layers)
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


# --- idf: once per job, over every reference ------------------------------------

def prepare(instances: list[dict], params) -> dict | None:
    """The registry's ``prepare`` hook, run once per job by the orchestrator.

    With ``idf`` it returns bert-score's idf weights (``get_idf_dict``) over
    every reference of every instance, as JSON: each task then weighs tokens as
    bert-score does when it scores the whole dataset at once. Its definition, computed
    here: ``log((N + 1) / (n + 1))`` for a token in n of the N references, each reference
    tokenized as bert_score's ``sent_encode`` does (the engine's ``encode``: one call for
    them all, on one core, where bert_score tokenizes one sentence at a time).
    """
    if not params.idf:
        return None
    from evalq.workers.metrics.bertscore_engine import encode

    resolved = resolve(params)
    tokenizer = load_tokenizer(resolved.path, params.use_fast_tokenizer, native_ok(resolved.path, params.engine))
    references = [ref for inst in instances for ref in inst["expected-output"]]
    # One core: the orchestrator has threads (progress, Redis, Celery) and may be a
    # prefork pool's parent, where neither a process pool nor the Rust tokenizer's
    # threads are safe across a fork (a Pool here hung the test suite).
    counts: Counter[int] = Counter()
    for ids in encode(tokenizer, references, parallel=False):
        counts.update(set(ids))
    num_docs = len(references)
    idf = {token: math.log((num_docs + 1) / (n + 1)) for token, n in counts.items()}
    return {"num_docs": num_docs, "idf": {str(k): v for k, v in sorted(idf.items())}}


_idf_cache: list = []  # [(prepared object, dict)]: one job's weights, rebuilt once per process


def idf_weights(params, prepared: dict | None, tokenizer) -> dict:
    if not params.idf:
        weights = defaultdict(lambda: 1.0)
        weights[tokenizer.sep_token_id] = 0
        weights[tokenizer.cls_token_id] = 0
        return weights
    if not isinstance(prepared, dict) or "idf" not in prepared:
        raise RuntimeError("idf weights are missing: the job was stored without its prepare step")
    if _idf_cache and _idf_cache[0][0] is prepared:
        return _idf_cache[0][1]
    unseen = math.log((prepared["num_docs"] + 1) / 1)  # bert-score's weight for unseen tokens
    weights = defaultdict(lambda: unseen)
    weights.update({int(k): v for k, v in prepared["idf"].items()})
    _idf_cache[:] = [(prepared, weights)]
    return weights


# --- scoring -------------------------------------------------------------------

@lru_cache(maxsize=8)
def _baseline_values(file: str, num_layers: int, all_layers: bool):
    """As ``BERTScorer.baseline_vals``: P, R, F for the layer (or every layer)."""
    import pandas as pd
    import torch

    table = pd.read_csv(file)
    if all_layers:
        return torch.from_numpy(table.to_numpy())[:, 1:].float()  # (layers, 3)
    return torch.from_numpy(table.iloc[num_layers].to_numpy())[1:].float()  # (3,)


def _number(value: float) -> float | None:
    # bert-score leaves P undefined (NaN) when every candidate token has idf 0;
    # JSON has no NaN, so the value is null and aggregation skips it.
    return None if math.isnan(value) else value


def best_of_references(preds, groups: list[tuple[int, int]]):
    """Each instance's best P, R and F1 over its references' rows ``preds[start:stop]``, value
    by value (NaN kept), as ``preds[start:stop].max(dim=0)`` gives it, in one gather rather than
    a tensor operation per instance (90 ms per 20,000 instances)."""
    import torch

    widest = max(stop - start for start, stop in groups)
    if widest == 1:  # one reference each: the rows themselves, in order
        return preds[: len(groups)] if len(preds) == len(groups) else preds[[start for start, _ in groups]]
    bounds = torch.tensor(groups, dtype=torch.long)
    starts, sizes = bounds[:, 0:1], bounds[:, 1:2] - bounds[:, 0:1]
    cols = torch.arange(widest)[None, :]
    # an instance with fewer references repeats its first: the maximum is unchanged
    rows = torch.where(cols < sizes, starts + cols, starts)
    return preds[rows].amax(dim=1)


def bertscore(instances: list[dict], params, prepared: dict | None = None) -> list[dict]:
    """Precision, recall and F1 per instance, best over its references.

    As ``BERTScorer.score`` with a list of references per candidate: each of P,
    R and F1 is the maximum over the references (they may come from different
    references), then rescaled with the baseline when asked. With
    ``all_layers`` each value is a list, one per layer (embeddings first).
    """
    if not instances:
        return []
    import torch

    resolved = resolve(params)
    device = pick_device(params.device)
    model, tokenizer = load_model(resolved.path, resolved.num_layers, params.all_layers,
                                  params.use_fast_tokenizer, device, native_ok(resolved.path, params.engine))
    weights = idf_weights(params, prepared, tokenizer)

    cands: list[str] = []
    refs: list[str] = []
    groups: list[tuple[int, int]] = []
    for inst in instances:
        group = inst["expected-output"]
        groups.append((len(refs), len(refs) + len(group)))
        refs.extend(group)
        cands.extend([inst["actual-output"]] * len(group))

    if params.engine == "bert_score":
        from bert_score.utils import bert_cos_score_idf

        preds = bert_cos_score_idf(model, refs, cands, tokenizer, weights, verbose=params.verbose,
                                   batch_size=params.batch_size, device=device,
                                   all_layers=params.all_layers).cpu()
        if params.all_layers:
            preds = preds.transpose(0, 1)  # (pairs, layers, 3)
    else:
        from evalq.workers.metrics import bertscore_engine

        preds = bertscore_engine.score(model, tokenizer, cands, refs, weights, device, params.batch_size,
                                       params.all_layers, params.dtype, params.max_batch_tokens)
    best = best_of_references(preds, groups)
    if params.rescale_with_baseline:
        baseline = _baseline_values(resolved.baseline, resolved.num_layers, params.all_layers)
        best = (best - baseline) / (1 - baseline)

    if not params.all_layers:
        return [{"precision": _number(p), "recall": _number(r), "f1": _number(f)} for p, r, f in best.tolist()]
    results = []
    for row in best.tolist():
        p, r, f = ([_number(layer[i]) for layer in row] for i in range(3))
        results.append({"precision": p, "recall": r, "f1": f})
    return results


def warm(params) -> str:
    """The registry's ``warm`` hook: these parameters' model and tokenizer loaded into this
    process, and one pair scored with them (the engine's imports and the device's kernels ready),
    before a chunk asks for them. Says what it loaded."""
    bertscore([{"actual-output": "warm", "expected-output": ["warm"]}],
              params.model_copy(update={"idf": False, "rescale_with_baseline": False}))
    resolved = resolve(params)
    return f"{resolved.name} (layer {resolved.num_layers}) on {pick_device(params.device)}"
