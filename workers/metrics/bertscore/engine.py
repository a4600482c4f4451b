"""evalq's BERTScore engine: bert_score's definition, computed at the device's pace.

The same numbers as ``bert_score.utils.bert_cos_score_idf`` (within float rounding: fp32 F1 within
1e-6), the way a GPU wants them:

- **Tokenization** as bert_score's ``sent_encode``: each sentence stripped, truncated to the
  tokenizer's ``model_max_length``, an empty one encoded as the special tokens alone, GPT-2 and
  RoBERTa tokenizers asked for a prefix space one sentence at a time; but one batch call, to a
  copy of a fast tokenizer's Rust tokenizer on every core where that copy gives bert_score's ids
  on the first sentences (else bert_score's own calls), on a GPU in a thread that prepares the
  next batch while the device works on this one.
- **Forward passes** over each distinct sentence once, in batches sized in tokens (``max_batch_tokens``)
  and formed by length: on a GPU by characters (a batch tokenized ahead, so one pads little), on a CPU
  by tokens (tokenized first, so none pads); optionally bf16/fp16 (``dtype``; matched in fp32).
- **Greedy matching** vectorised on the device over many pairs at once: cosine similarities,
  each token's best match, idf weights normalised per sentence. bert_score pads each group of
  ``batch_size`` pairs with zero similarities, so a token whose every real similarity is negative
  scores 0 where its sentence is shorter than its group's longest; that rule is kept exactly,
  per pair, from the group each pair would have been in.
- The special tokens weigh 0 (bert_score's idf dictionary), an empty candidate or reference scores
  0 (P and R; F as bert_score leaves it), an undefined F is 0.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import sys
import threading
import weakref
from typing import Any, Iterator

from evalq.workers import cores

DTYPES = {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}

log = logging.getLogger("evalq.bertscore")


_backends: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
_parallel = threading.Lock()


def _backend(tokenizer, sample: list[str]):
    """A copy of a fast tokenizer's Rust tokenizer set up as bert_score's call sets it up
    (special tokens, truncation to ``model_max_length``, no padding), or None where the tokenizer
    has none or the copy tokenizes ``sample`` differently from bert_score's call of the tokenizer
    (``_reference``): then that call is used. The copy skips the Python work transformers does for each
    sentence of a batch, and may use every core."""
    try:
        return _backends[tokenizer]
    except (KeyError, TypeError):
        pass
    backend = None
    inner = getattr(tokenizer, "_tokenizer", None)
    try:
        from tokenizers import Tokenizer

        if isinstance(inner, Tokenizer):
            backend = Tokenizer.from_str(inner.to_str())
            backend.no_padding()
            backend.enable_truncation(tokenizer.model_max_length, stride=0, strategy="longest_first",
                                      direction=getattr(tokenizer, "truncation_side", "right"))
            if _ids(backend, sample) != _reference(tokenizer, sample):
                backend = None
    except Exception:  # noqa: BLE001 - any doubt: the tokenizer's own call
        backend = None
    try:
        _backends[tokenizer] = backend
    except TypeError:
        pass
    return backend


def _ids(backend, texts: list[str]) -> list[list[int]]:
    batch = getattr(backend, "encode_batch_fast", None) or backend.encode_batch  # _fast: no offsets
    return [e.ids for e in batch(texts, add_special_tokens=True)]


def _hf_encode(tokenizer, sentences: list[str]) -> list[list[int]]:
    return [list(x) for x in tokenizer(sentences, add_special_tokens=True, max_length=tokenizer.model_max_length,
                                       truncation=True)["input_ids"]] if sentences else []


def _gpt2_or_roberta(tokenizer) -> bool:
    if "transformers" not in sys.modules:  # a tokenizer of transformers' would have imported it
        return False
    from transformers import GPT2Tokenizer, RobertaTokenizer

    return isinstance(tokenizer, (GPT2Tokenizer, RobertaTokenizer))


def _reference(tokenizer, texts: list[str]) -> list[list[int]]:
    """bert_score's ``sent_encode`` of each (stripped, non-empty) text, through the tokenizer
    itself: a GPT-2 or RoBERTa tokenizer one text at a time with a prefix space asked for
    (bert_score checks the slow classes only; transformers 5 leaves the pre-tokenizer's own
    setting), any other in one call."""
    if _gpt2_or_roberta(tokenizer):
        kwargs: dict[str, Any] = {"add_special_tokens": True, "max_length": tokenizer.model_max_length,
                                  "truncation": True, "add_prefix_space": True}
        return [list(tokenizer.encode(text, **kwargs)) for text in texts]
    return _hf_encode(tokenizer, texts)


def encode(tokenizer, sentences: list[str], parallel: bool = False) -> list[list[int]]:
    """Token ids of each sentence, as bert_score's ``sent_encode`` gives them. ``parallel``: a
    fast tokenizer may use every core for the batch (the gpu worker's cores are otherwise idle)."""
    stripped = [s.strip() for s in sentences]
    out: list[list[int] | None] = [None] * len(stripped)
    filled = [i for i, s in enumerate(stripped) if s]
    texts = [stripped[i] for i in filled]
    if texts and (backend := _backend(tokenizer, texts[:64])) is not None:
        with _parallel:  # the Rust tokenizer reads the variable at each call
            before = os.environ.get("TOKENIZERS_PARALLELISM")
            os.environ["TOKENIZERS_PARALLELISM"] = "true" if parallel else "false"
            try:
                ids = _ids(backend, texts)
            finally:
                if before is None:
                    os.environ.pop("TOKENIZERS_PARALLELISM", None)
                else:
                    os.environ["TOKENIZERS_PARALLELISM"] = before
    else:
        ids = _reference(tokenizer, texts)
    for i, one in zip(filled, ids):
        out[i] = list(one)
    if len(filled) < len(stripped):
        empty = list(tokenizer.build_inputs_with_special_tokens([]))
        for i, s in enumerate(stripped):
            if not s:
                out[i] = empty
    return out  # type: ignore[return-value]


def _batches(sentences: list[str], max_tokens: int, max_sentences: int = 4096) -> list[list[int]]:
    """Indices of the sentences in batches of similar length, longest first, each about
    ``max_tokens`` tokens padded (estimated from characters before tokenization: ~3 a token)."""
    order = sorted(range(len(sentences)), key=lambda i: -len(sentences[i]))
    batches, current, longest = [], [], 0
    for i in order:
        estimate = max(len(sentences[i]) // 3 + 4, 3)
        if current and ((len(current) + 1) * max(longest, estimate) > max_tokens or len(current) >= max_sentences):
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, estimate)
    if current:
        batches.append(current)
    return batches


def _by_length(ids: list[list[int]], max_tokens: int) -> Iterator[tuple[list[int], list]]:
    """(indices, token ids) of batches of one token length (none padded, attention unmasked), longest
    first, each at most ``max_tokens`` tokens; shorter sentences join (padded) only a batch of fewer
    than ``max_tokens // 8`` tokens, so a rare length makes no batch of a few rows (BENCHMARKS.md)."""
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    current: list[int] = []
    real = 0
    for i in order:
        if current and ((len(current) + 1) * len(ids[current[0]]) > max_tokens
                        or (len(ids[i]) != len(ids[current[-1]]) and real >= max_tokens // 8)):
            yield current, [ids[j] for j in current]
            current, real = [], 0
        current.append(i)
        real += len(ids[i])
    if current:
        yield current, [ids[j] for j in current]


def _tokenized(tokenizer, sentences: list[str], batches: list[list[int]]) -> Iterator[tuple[list[int], list]]:
    """(indices, token ids) of each batch, tokenized in a thread one batch ahead of its consumer.
    A consumer that stops early (a forward pass that raised) stops the thread too."""
    ahead: queue.Queue = queue.Queue(maxsize=2)
    failed: list[BaseException] = []
    stopped = threading.Event()

    def put(item) -> bool:
        while not stopped.is_set():
            try:
                ahead.put(item, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def produce() -> None:
        try:
            for idx in batches:
                if not put((idx, encode(tokenizer, [sentences[i] for i in idx], parallel=True))):
                    return
        except BaseException as exc:  # noqa: BLE001 - re-raised in the consumer
            failed.append(exc)
        finally:
            put(None)

    thread = threading.Thread(target=produce, name="evalq-bertscore-tokenize", daemon=True)
    thread.start()
    try:
        while (item := ahead.get()) is not None:
            yield item
    finally:
        stopped.set()
        thread.join()
    if failed:
        raise failed[0]


class Embedded:
    """Every token embedding of a set of sentences in one tensor: ``flat`` ``[tokens + 1, (layers,)
    d]`` (L2-normalised, fp32, on the device; the last row zeros, what padding points at), each
    sentence at ``offsets[i]`` for ``lengths[i]`` rows; ``tokens``: each row's token id (numpy)."""

    def __init__(self, flat, offsets, lengths, tokens):
        self.flat, self.offsets, self.lengths, self.tokens = flat, offsets, lengths, tokens

    @property
    def pad(self) -> int:
        return self.flat.shape[0] - 1

    def index(self, sentences, width: int):
        """``[len(sentences), width]`` rows of ``flat`` for these sentences, padding -> the zero row."""
        import numpy as np

        offsets, lengths = self.offsets[sentences], self.lengths[sentences]
        cols = np.arange(width)[None, :]
        return np.where(cols < lengths[:, None], offsets[:, None] + cols, self.pad)


def _grid(ids: list[list[int]], pad: int):
    """(``[len(ids), longest]`` token ids padded with ``pad``, which cells are real, lengths,
    the ids flat): numpy, built without a Python loop over the rows."""
    import numpy as np

    lens = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64, count=int(lens.sum()))
    real = np.arange(int(lens.max()))[None, :] < lens[:, None]
    grid = np.full(real.shape, pad, dtype=np.int64)
    grid[real] = flat
    return grid, real, lens, flat


def _forward(model, ids: list, pad: int, device: str, all_layers: bool, autocast: str | None):
    """One forward pass over a batch of token ids: its real tokens' embeddings (normalised, fp32)
    row by row, the sentences' lengths and their token ids flat."""
    import numpy as np
    import torch

    grid, real, lens, flat_ids = _grid(ids, pad)
    batch = torch.from_numpy(grid).to(device, non_blocking=True)
    # a batch of one length has nothing to mask: attention takes its unmasked path
    attention = None if real.all() else torch.from_numpy(real).to(device=device, dtype=torch.long)
    if autocast is None:
        out = model(batch, attention_mask=attention, output_hidden_states=all_layers)
    else:
        with torch.autocast(device_type=device.split(":")[0], dtype=getattr(torch, autocast)):
            out = model(batch, attention_mask=attention, output_hidden_states=all_layers)
    hidden = (torch.stack(out[-1], dim=2) if all_layers else out[0]).float()
    hidden = hidden / torch.norm(hidden, dim=-1, keepdim=True)
    # the real tokens, row by row: their places are known here, so the device is not asked
    keep = torch.from_numpy(np.flatnonzero(real)).to(device, non_blocking=True)
    return hidden.reshape(-1, *hidden.shape[2:]).index_select(0, keep), lens, flat_ids


def _forwards(model, batches, pad: int, device: str, all_layers: bool, autocast: str | None):
    """(indices, embeddings, lengths, token ids) of each batch. A batch the device has no memory
    for (a smaller GPU, long texts, another process on the device) is split in two and each half
    run, down to one sentence, whose failure is the chunk's; the embeddings are the same. Later
    batches as large (in padded tokens) as one that failed are split before they are tried."""
    import torch

    too_big = None  # padded tokens of the smallest batch that did not fit
    for idx, ids in batches:
        todo = [(idx, ids)]
        while todo:
            idx, ids = todo.pop()
            padded = len(idx) * max(map(len, ids))
            found, failed = None, False
            if too_big is None or padded < too_big or len(idx) < 2:
                cores.fit(device)  # on a CPU: the CPUs of this worker's idle processes, if it has several
                try:
                    found, lens, flat_ids = _forward(model, ids, pad, device, all_layers, autocast)
                except torch.OutOfMemoryError:
                    if len(idx) < 2:
                        raise
                    if too_big is None:
                        log.warning("bertscore: out of memory on %s for %d sentences (%d tokens padded): batches "
                                    "are split until they fit; a lower max_batch_tokens avoids it",
                                    device, len(idx), padded)
                    too_big, failed = padded if too_big is None else min(too_big, padded), True
            if found is None:  # too large: split in two
                if failed and device.startswith("cuda"):  # the failed pass's tensors went with the exception
                    torch.cuda.empty_cache()
                half = len(idx) // 2
                todo += [(idx[half:], ids[half:]), (idx[:half], ids[:half])]
                continue
            yield idx, found, lens, flat_ids


def embed(model, tokenizer, sentences: list[str], device: str, all_layers: bool = False, dtype: str = "fp32",
          max_batch_tokens: int | None = None, ahead: bool | None = None) -> Embedded:
    """The token embeddings of each sentence (each distinct sentence once), as bert_score's
    ``get_bert_embedding`` computes them (last layer, or every layer), in batches of ``batch_tokens``
    padded tokens. ``ahead``: tokenized a batch ahead in a thread (None: on a GPU), else all first."""
    import numpy as np
    import torch

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    autocast, max_batch_tokens = DTYPES[dtype], batch_tokens(device, max_batch_tokens)
    known = None  # every token, counted before the first forward pass where the sentences are tokenized first
    if device.startswith("cuda") if ahead is None else ahead:  # a batch ahead: the device never waits for it
        batches = _tokenized(tokenizer, sentences, _batches(sentences, max_batch_tokens))
    else:  # the CPU runs the forward passes on every core: tokenized first, batched by exact length
        ids_all = encode(tokenizer, sentences, parallel=True)
        known = sum(map(len, ids_all))
        batches = _by_length(ids_all, max_batch_tokens)
    parts, tokens, flat = [], [], None
    offsets = np.zeros(len(sentences), dtype=np.int64)
    lengths = np.zeros(len(sentences), dtype=np.int64)
    total = 0
    with torch.inference_mode():
        for idx, found, lens, flat_ids in _forwards(model, batches, pad, device, all_layers, autocast):
            if known is None:
                parts.append(found)
            else:  # into one tensor as they come: the chunk's embeddings are never held twice
                if flat is None:
                    flat = torch.empty((known + 1, *found.shape[1:]), device=device)
                    flat[known:].zero_()  # the last row: what padding points at
                flat[total:total + len(found)] = found
            rows = np.asarray(idx, dtype=np.int64)
            offsets[rows] = total + np.cumsum(lens) - lens
            lengths[rows] = lens
            total += int(lens.sum())
            tokens.append(flat_ids)
        if flat is None:
            zero = torch.zeros((1, *parts[0].shape[1:]), device=device) if parts else torch.zeros((1, 1), device=device)
            flat = torch.cat(parts + [zero]) if parts else zero
    return Embedded(flat, offsets, lengths, np.concatenate(tokens) if tokens else np.zeros(0, dtype=np.int64))


def weight_table(weights, tokens, device: str):
    """A token's weight (bert_score's idf dictionary: 0 for the special tokens, 1 for the others
    without idf) as a table indexed by token id, on the device."""
    import torch

    size = max(int(tokens.max()) if len(tokens) else 0, max(weights.keys(), default=0)) + 1
    default = weights.default_factory() if getattr(weights, "default_factory", None) is not None else 1.0
    table = torch.full((size,), float(default))
    if weights:
        keys = torch.tensor(list(weights.keys()), dtype=torch.long)
        table[keys] = torch.tensor([float(v) for v in weights.values()])
    return table.to(device)


# Floats one matching step holds at most (512 MiB in fp32): its pairs' gathered token embeddings and
# three similarity matrices. 4,096 short pairs fit; 4,096 pairs of 500-token texts would need about
# 20 GB at once (BENCHMARKS.md), so such steps take fewer pairs.
MATCH_ELEMENTS = 1 << 27


def _steps(cand_len, ref_len, row: int, layers: int, most: int, budget: int) -> Iterator[tuple[int, int]]:
    """(start, stop) of the matching steps over the pairs, in order: at most ``most`` pairs each,
    and only as many as keep the step's tensors within ``budget`` floats at its longest candidate
    and reference (``row`` floats a token's embedding, ``layers`` similarity matrices a pair; one
    pair at least). Every pair is matched on its own, so the steps change no value beyond float
    rounding (a step's sums run over its own padded width)."""
    n, start = len(cand_len), 0
    while start < n:
        stop = min(n, start + most)
        lh, lr = int(cand_len[start:stop].max()), int(ref_len[start:stop].max())
        per_pair = max(1, (lh + lr) * row + 3 * layers * lh * lr)  # a tokenizer may give an empty text no token
        stop = min(stop, start + max(1, budget // per_pair))
        yield start, stop
        start = stop


def match(emb: Embedded, token_weights, cands: list[int], refs: list[int], group: int, device: str,
          all_layers: bool = False, pairs_per_step: int = 4096, max_elements: int = MATCH_ELEMENTS):
    """P, R, F1 of each (candidate, reference) pair of sentence indices into ``emb``, as
    bert_score's ``greedy_cos_idf`` over its groups of ``group`` pairs: ``[pairs, 3]`` (or
    ``[pairs, layers, 3]``), fp32, on the CPU. ``token_weights``: each row of ``emb.flat``'s weight.
    Matched ``pairs_per_step`` pairs at a time, fewer where long sentences would make a step hold
    more than ``max_elements`` floats."""
    import numpy as np
    import torch

    cands, refs = np.asarray(cands, dtype=np.int64), np.asarray(refs, dtype=np.int64)
    n = len(cands)
    cand_len, ref_len = emb.lengths[cands], emb.lengths[refs]
    # the longest sentence of the group of ``group`` pairs each pair is in (bert_score pads to it)
    group_cand = np.repeat(np.maximum.reduceat(cand_len, np.arange(0, n, group)), group)[:n] if n else cand_len
    group_ref = np.repeat(np.maximum.reduceat(ref_len, np.arange(0, n, group)), group)[:n] if n else ref_len
    row = int(np.prod(emb.flat.shape[1:]))  # a token's floats: every layer's with all_layers
    layers = emb.flat.shape[1] if all_layers else 1
    results = []
    with torch.inference_mode():
        for s, e in _steps(cand_len, ref_len, row, layers, pairs_per_step, max_elements):
            lh_np, lr_np = cand_len[s:e], ref_len[s:e]
            hidx = torch.from_numpy(emb.index(cands[s:e], int(lh_np.max()))).to(device, non_blocking=True)
            ridx = torch.from_numpy(emb.index(refs[s:e], int(lr_np.max()))).to(device, non_blocking=True)
            hyp, ref = emb.flat[hidx], emb.flat[ridx]  # [B, L, (layers,) d]
            if all_layers:  # -> [layers, B, L, d]
                hyp, ref = hyp.permute(2, 0, 1, 3), ref.permute(2, 0, 1, 3)
            sim = torch.matmul(hyp, ref.transpose(-1, -2))  # [(layers,) B, Lh, Lr]
            lh, lr = torch.from_numpy(lh_np).to(device), torch.from_numpy(lr_np).to(device)
            h_real = torch.arange(sim.shape[-2], device=device)[None, :] < lh[:, None]  # [B, Lh]
            r_real = torch.arange(sim.shape[-1], device=device)[None, :] < lr[:, None]  # [B, Lr]
            neg = torch.finfo(sim.dtype).min
            best_p = sim.masked_fill(~r_real[:, None, :], neg).amax(dim=-1)  # [(layers,) B, Lh]
            best_r = sim.masked_fill(~h_real[:, :, None], neg).amax(dim=-2)  # [(layers,) B, Lr]
            # bert_score's zero padding: a pair shorter than its group's longest also sees 0
            ref_padded = torch.from_numpy(lr_np < group_ref[s:e]).to(device)[:, None]
            hyp_padded = torch.from_numpy(lh_np < group_cand[s:e]).to(device)[:, None]
            best_p = torch.where(ref_padded, best_p.clamp(min=0.0), best_p)
            best_r = torch.where(hyp_padded, best_r.clamp(min=0.0), best_r)
            w_h, w_r = token_weights[hidx], token_weights[ridx]  # 0 at padding
            w_h = w_h / w_h.sum(dim=1, keepdim=True)
            w_r = w_r / w_r.sum(dim=1, keepdim=True)
            P = (best_p * w_h).sum(dim=-1)
            R = (best_r * w_r).sum(dim=-1)
            F = 2 * P * R / (P + R)
            empty = (lh == 2) | (lr == 2)  # an empty candidate or reference: P and R 0, as bert_score
            P, R = P.masked_fill(empty, 0.0), R.masked_fill(empty, 0.0)
            F = F.masked_fill(torch.isnan(F), 0.0)
            out = torch.stack((P, R, F), dim=-1)  # [(layers,) B, 3]
            if all_layers:
                out = out.transpose(0, 1)  # [B, layers, 3]
            results.append(out.cpu())
    return torch.cat(results, dim=0) if results else torch.zeros((0, 3))


def batch_tokens(device: str, asked: int | None = None) -> int:
    """Padded tokens a forward pass holds: ``max_batch_tokens`` as asked, else 65,536 on a GPU, 2,048 on a CPU."""
    return asked or (65536 if device.startswith("cuda") else 2048)


def score(model, tokenizer, cands: list[str], refs: list[str], weights, device: str, batch_size: int,
          all_layers: bool = False, dtype: str = "fp32", max_batch_tokens: int | None = None):
    """bert_score's ``bert_cos_score_idf(model, refs, cands, ...)``: ``[pairs, 3]`` (or
    ``[pairs, layers, 3]``), P, R, F1 of each candidate against the reference beside it."""
    import torch

    distinct = list(dict.fromkeys(cands + refs))
    emb = embed(model, tokenizer, distinct, device, all_layers, dtype, max_batch_tokens)
    table = weight_table(weights, emb.tokens, device)
    token_weights = torch.cat([table[torch.from_numpy(emb.tokens).to(device)], torch.zeros(1, device=device)])
    where = {s: i for i, s in enumerate(distinct)}
    return match(emb, token_weights, [where[s] for s in cands], [where[s] for s in refs], batch_size, device,
                 all_layers)
