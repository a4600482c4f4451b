"""BERTScore, the metric the gpu queue runs: the ``prepare`` hook that computes idf weights once
per job over every reference, and the batch function the runner calls with a chunk of instances,
scored by evalq's engine (``engine``, the default) or by the bert-score package's own
``bert_cos_score_idf`` (``engine: bert_score``). The model and tokenizer come from ``models``.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from functools import lru_cache

from evalq.shared.metrics.bertscore import resolve
from evalq.workers.metrics.bertscore.models import load_model, load_tokenizer, native_ok, pick_device


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
    from evalq.workers.metrics.bertscore.engine import encode

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
    if widest == 1:  # one reference each: the rows themselves
        return preds if len(preds) == len(groups) else preds[[start for start, _ in groups]]
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
        from evalq.workers.metrics.bertscore import engine

        preds = engine.score(model, tokenizer, cands, refs, weights, device, params.batch_size,
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
