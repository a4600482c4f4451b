"""evalq's BERTScore engine (issue 40) against bert-score's own BERTScorer, computed here on the same
pairs, model, layer and settings: fp32 precision, recall and F1 within 1e-6 with idf on and off,
several references, texts longer than the model's limit, empty candidates and references, batch
boundaries (bert_score's zero-padding rule per group of pairs), baseline rescaling, every layer, and a
bert-large-sized model (24 layers, hidden 1024) built with random weights; bf16 within its documented
tolerance."""

from __future__ import annotations

import json
import random
import types

import pytest

import evalq.shared.job.catalogue  # noqa: F401
from evalq.shared.metrics import bertscore as models
from evalq.workers.metrics.bertscore import engine as bertscore_engine
from tests.unit.test_bertscore import INSTANCES, all_refs, cands, refs
from tests.unit.test_bertscore import run as evalq_scores  # prepared once, chunks apart, via JSON

bert_score = pytest.importorskip("bert_score")

MODEL_DIR = models.bundled_model_dir()
LAYERS = models.BUNDLED_NUM_LAYERS
EXACT = 1e-6  # fp32: the same computation, summed in another order
BF16 = 5e-3   # bf16 forward passes (docs: within about 1e-3 of fp32; a CPU's bf16 is coarser)

WORDS = ("time person year way day thing man world life hand part child eye woman place work week case point "
         "government company number group problem fact river city music garden window morning letter market "
         "doctor answer quickly slowly often never always together again almost already later soon today").split()


def synthetic(n: int, refs_per_item: int, seed: int) -> list[dict]:
    rng = random.Random(seed)

    def perturb(words):
        return " ".join(rng.choice(WORDS) if rng.random() < 0.2 else w for w in words if rng.random() > 0.07)

    out = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, 40))]
        out.append({"id": f"s{i}", "actual-output": " ".join(words).capitalize() + ".",
                    "expected-output": [perturb(words) for _ in range(refs_per_item)]})
    return out


def assert_equal(ours: list[dict], P, R, F, tol: float = EXACT) -> None:
    assert len(ours) == len(P)
    worst = 0.0
    for o, p, r, f in zip(ours, P.tolist(), R.tolist(), F.tolist()):
        for key, ref in (("precision", p), ("recall", r), ("f1", f)):
            got = o[key]
            if isinstance(ref, list):
                worst = max([worst] + [abs(a - b) for a, b in zip(got, ref)])
            else:
                worst = max(worst, abs(got - ref))
    assert worst <= tol, f"max |difference| {worst:.2e} > {tol:.0e}"


@pytest.fixture(scope="module")
def scorer():
    made = {}

    def get(model=MODEL_DIR, layers=LAYERS, **kw):
        key = json.dumps([model, layers, kw], sort_keys=True, default=str)
        if key not in made:
            made[key] = bert_score.BERTScorer(model_type=model, num_layers=layers, device="cpu", nthreads=0, **kw)
        return made[key]

    return get


@pytest.mark.parametrize("idf", [False, True])
def test_equal_to_bertscorer_with_several_references(scorer, idf):
    data = INSTANCES + synthetic(60, 3, seed=1)
    ours = evalq_scores(data, chunk=25, idf=idf, batch_size=16)
    reference = scorer(idf=idf, idf_sents=all_refs(data) if idf else None, batch_size=16)
    assert_equal(ours, *reference.score(cands(data), refs(data)))


def test_batch_boundaries_and_the_zero_padding_rule(scorer):
    """bert_score pads each group of batch_size pairs with zero similarities: a pair shorter than its
    group's longest sees a 0 beside its real similarities. Groups of 7 over 53 pairs of very uneven
    lengths, in chunks that cut groups."""
    data = synthetic(53, 1, seed=2)
    for batch in (1, 7, 64):
        ours = evalq_scores(data, chunk=20, batch_size=batch)
        assert_equal(ours, *scorer(batch_size=batch).score(cands(data), [r[0] for r in refs(data)]))


def test_long_texts_are_truncated_as_bert_score_truncates(scorer):
    long_cand = " ".join(["the cat sat on the mat and looked around"] * 400)
    long_ref = " ".join(["a dog slept under the table all day long"] * 400)
    data = [{"id": "l", "actual-output": long_cand, "expected-output": [long_ref, "short one"]},
            {"id": "m", "actual-output": "short", "expected-output": [long_ref]}]
    assert_equal(evalq_scores(data), *scorer().score(cands(data), refs(data)))


@pytest.mark.parametrize("idf", [False, True])
def test_empty_candidates_and_references(scorer, idf):
    data = [{"id": "a", "actual-output": "", "expected-output": ["Some text here."]},
            {"id": "b", "actual-output": "A plain answer.", "expected-output": ["   "]},
            {"id": "c", "actual-output": "   ", "expected-output": [""]},
            INSTANCES[1], INSTANCES[3]]
    ours = evalq_scores(data, idf=idf)
    single = [r[0] for r in refs(data)]
    reference = scorer(idf=idf)
    # bert-score 0.3.13 encodes an empty sentence with build_inputs_with_special_tokens([]), which
    # transformers 5's tokenizers lack: given back with its old meaning (the special tokens alone)
    from evalq.workers.metrics.bertscore.models import _fix_tokenizer

    reference._tokenizer = _fix_tokenizer(reference._tokenizer, MODEL_DIR)
    if idf:
        reference.compute_idf(single)
    P, R, F = reference.score(cands(data), single)
    for o, p, r, f in zip(ours, P.tolist(), R.tolist(), F.tolist()):
        for got, want in ((o["precision"], p), (o["recall"], r), (o["f1"], f)):
            assert (got is None and want != want) or abs(got - want) <= EXACT, (o, p, r, f)
    assert ours[0] == {"precision": 0.0, "recall": 0.0, "f1": 0.0}


def test_baseline_rescaling_and_every_layer(scorer, tmp_path):
    baseline = tmp_path / "baseline.csv"
    baseline.write_text("LAYER,P,R,F\n" + "".join(f"{i},{0.3 + i / 50},{0.31 + i / 50},{0.305 + i / 50}\n"
                                                 for i in range(LAYERS + 1)))
    data = synthetic(20, 2, seed=3)
    ours = evalq_scores(data, model_type=models.BUNDLED_MODEL, lang="en", rescale_with_baseline=True,
                        baseline_path=str(baseline))
    assert_equal(ours, *scorer(lang="en", rescale_with_baseline=True, baseline_path=str(baseline))
                 .score(cands(data), refs(data)))
    single = [{**i, "expected-output": i["expected-output"][:1]} for i in data]
    ours = evalq_scores(single, all_layers=True)
    P, R, F = scorer(all_layers=True).score(cands(single), [r[0] for r in refs(single)])
    assert_equal(ours, P.T, R.T, F.T)


def test_a_bert_large_sized_model_with_random_weights(scorer, tmp_path):
    """The shape of bert-large (24 layers, hidden 1024, 16 heads) on the shipped tokenizer, weights
    drawn at random (too large to carry): the engine at layer 18 equals BERTScorer's."""
    import shutil

    import torch
    from transformers import BertConfig, BertModel

    folder = tmp_path / "bert-large-shaped"
    folder.mkdir()
    for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.json"):
        if (models.Path(MODEL_DIR) / name).exists():
            shutil.copy(models.Path(MODEL_DIR) / name, folder / name)
    base = BertConfig.from_pretrained(MODEL_DIR)
    config = BertConfig(vocab_size=base.vocab_size, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                        intermediate_size=4096, max_position_embeddings=512)
    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder)
    data = synthetic(6, 2, seed=4)
    ours = evalq_scores(data, model_type=str(folder), num_layers=18, batch_size=4)
    assert_equal(ours, *scorer(model=str(folder), layers=18, batch_size=4).score(cands(data), refs(data)))


def test_bf16_is_within_its_tolerance_and_bert_score_stays_selectable(scorer):
    data = synthetic(30, 2, seed=5)
    reference = scorer().score(cands(data), refs(data))
    assert_equal(evalq_scores(data, dtype="bf16"), *reference, tol=BF16)
    assert_equal(evalq_scores(data, engine="bert_score"), *reference)
    small = evalq_scores(data, max_batch_tokens=64)  # one sentence a forward pass: the same numbers
    assert_equal(small, *reference)


def test_tokenization_is_bert_scores():
    from bert_score.utils import sent_encode

    from evalq.workers.metrics.bertscore.models import load_tokenizer

    for fast in (False, True):
        tok = load_tokenizer(MODEL_DIR, fast)
        sentences = ["  Padded text.  ", "", "   ", "Ünïcödé naïve café — “quotes”", "x " * 700,
                     *[i["actual-output"] for i in synthetic(30, 1, seed=6)]]
        expected = [sent_encode(tok, s) for s in sentences]
        assert bertscore_engine.encode(tok, sentences) == expected
        assert bertscore_engine.encode(tok, sentences, parallel=True) == expected
        # the Rust tokenizer is called directly (its copy checked against the tokenizer's own call)
        assert bertscore_engine._backend(tok, sentences[:4]) is not None


def test_a_tokenizer_whose_rust_copy_disagrees_is_called_itself():
    """A tokenizer whose own call does more than its Rust tokenizer (here: reverses the text first)
    keeps its own call: the engine's tokens are still bert_score's."""
    from bert_score.utils import sent_encode

    from evalq.workers.metrics.bertscore.models import load_tokenizer

    base = load_tokenizer(MODEL_DIR, True)

    class Backwards(type(base)):
        def __call__(self, text, *args, **kwargs):
            turned = [t[::-1] for t in text] if isinstance(text, list) else text[::-1]
            return super().__call__(turned, *args, **kwargs)

        def encode(self, text, *args, **kwargs):
            return super().encode(text[::-1], *args, **kwargs)

    tok = Backwards.from_pretrained(MODEL_DIR)
    sentences = ["Hello there", "the Cat sat", *[i["actual-output"] for i in synthetic(10, 1, seed=8)]]
    assert bertscore_engine._backend(tok, sentences) is None
    assert bertscore_engine.encode(tok, sentences) == [sent_encode(tok, s) for s in sentences]


def _roberta_tokenizer(folder, add_prefix_space: bool):
    """A RoBERTa tokenizer (byte-level BPE, <s> ... </s>) trained here on a small corpus: none ships
    offline. ``add_prefix_space``: its pre-tokenizer adds one itself."""
    from tokenizers import ByteLevelBPETokenizer, processors

    rng = random.Random(1)
    bpe = ByteLevelBPETokenizer(add_prefix_space=add_prefix_space)
    bpe.train_from_iterator([" ".join(rng.choice(WORDS) for _ in range(12)) + "." for _ in range(2000)],
                            vocab_size=600, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    bpe._tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0),
                                                                 add_prefix_space=add_prefix_space)
    folder.mkdir()
    bpe._tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "RobertaTokenizer", "model_max_length": 64, "bos_token": "<s>", "eos_token": "</s>",
        "sep_token": "</s>", "cls_token": "<s>", "unk_token": "<unk>", "pad_token": "<pad>", "mask_token": "<mask>",
        "add_prefix_space": add_prefix_space}))
    return str(folder)


@pytest.mark.parametrize("add_prefix_space", [False, True])
def test_roberta_tokenizers_are_called_in_one_batch_with_bert_scores_ids(tmp_path, add_prefix_space):
    """bert_score encodes with a GPT-2 or RoBERTa tokenizer one sentence at a time, asking for a
    prefix space; the engine calls the Rust tokenizer on the whole batch where it gives the same
    ids on the first sentences (a per-sentence call costs about 10 us more a sentence)."""
    from bert_score.utils import sent_encode
    from transformers import RobertaTokenizer

    from evalq.workers.metrics.bertscore.models import load_tokenizer

    tok = load_tokenizer(_roberta_tokenizer(tmp_path / "roberta", add_prefix_space), False)
    assert isinstance(tok, RobertaTokenizer)
    sentences = ["  Padded text.  ", "", "The city music", "garden " * 100,
                 *[i["actual-output"] for i in synthetic(30, 1, seed=9)]]
    expected = [sent_encode(tok, s) for s in sentences]
    assert len(expected[3]) == 64  # truncated to the tokenizer's limit
    assert bertscore_engine._backend(tok, sentences[:8]) is not None
    assert bertscore_engine.encode(tok, sentences, parallel=True) == expected


def test_a_forward_pass_that_raises_stops_the_tokenizing_thread():
    """A gpu worker lives for many chunks: a chunk whose forward pass raised leaves no thread
    behind blocked on batches nobody takes."""
    import threading

    from evalq.workers.metrics.bertscore.models import load_tokenizer

    tok = load_tokenizer(MODEL_DIR, False)
    sentences = [i["actual-output"] for i in synthetic(200, 1, seed=9)]
    batches = bertscore_engine._tokenized(tok, sentences, [[i] for i in range(len(sentences))])
    next(batches)  # the consumer takes one batch, then its forward pass raises
    batches.close()
    assert not [t for t in threading.enumerate() if t.name == "evalq-bertscore-tokenize"]


def greedy_match(cand_emb: list, ref_emb: list, cand_idf: list, ref_idf: list, group: int, device: str,
                 all_layers: bool = False, pairs_per_step: int = 4096,
                 max_elements: int = bertscore_engine.MATCH_ELEMENTS):
    """The engine's ``match`` over lists of per-sentence embeddings (normalised) and weights, pair by
    pair: candidate i against reference i."""
    import numpy as np
    import torch

    sentences = list(cand_emb) + list(ref_emb)
    weights = list(cand_idf) + list(ref_idf)
    lengths = np.array([len(x) for x in sentences], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    flat = torch.cat(sentences + [torch.zeros((1, *sentences[0].shape[1:]))]).to(device)
    token_weights = torch.cat(weights + [torch.zeros(1)]).to(device)
    emb = bertscore_engine.Embedded(flat, offsets, lengths, None)
    n = len(cand_emb)
    return bertscore_engine.match(emb, token_weights, list(range(n)), list(range(n, 2 * n)), group, device,
                                  all_layers, pairs_per_step, max_elements)


def test_greedy_matching_equals_bert_scores_on_vectors_with_negative_similarities():
    """Random token vectors (similarities of both signs, so the zero padding matters): the engine's
    vectorised matching over many pairs at once equals bert_score's greedy_cos_idf run group by
    group, as bert_cos_score_idf runs it, with bert_score's own padding."""
    import torch
    from bert_score.utils import greedy_cos_idf
    from torch.nn.utils.rnn import pad_sequence

    torch.manual_seed(1)
    n, group, dim = 45, 8, 16
    lengths = [(int(torch.randint(2, 12, ())), int(torch.randint(2, 12, ()))) for _ in range(n)]
    cand = [torch.nn.functional.normalize(torch.randn(lc, dim), dim=-1) for lc, _ in lengths]
    ref = [torch.nn.functional.normalize(torch.randn(lr, dim), dim=-1) for _, lr in lengths]
    cand_idf = [torch.cat([torch.zeros(1), torch.rand(len(c) - 2) + 0.1, torch.zeros(1)]) for c in cand]
    ref_idf = [torch.cat([torch.zeros(1), torch.rand(len(r) - 2) + 0.1, torch.zeros(1)]) for r in ref]
    ours = greedy_match(cand, ref, cand_idf, ref_idf, group, "cpu", pairs_per_step=13)
    expected = []
    for s in range(0, n, group):
        def stats(emb, idf):
            lens = [len(e) for e in emb]
            mask = torch.arange(max(lens))[None, :] < torch.tensor(lens)[:, None]
            return pad_sequence(emb, batch_first=True, padding_value=2.0), mask, pad_sequence(idf, batch_first=True)
        P, R, F = greedy_cos_idf(*stats(ref[s:s + group], ref_idf[s:s + group]),
                                 *stats(cand[s:s + group], cand_idf[s:s + group]))
        expected.append(torch.stack((P, R, F), dim=-1))
    expected = torch.cat(expected)
    assert (ours - expected).abs().max().item() <= EXACT
    # and the rule matters here: matched alone (no group, no padding), many pairs score otherwise
    alone = greedy_match(cand, ref, cand_idf, ref_idf, 1, "cpu")
    assert ((alone - expected).abs() > 1e-3).any()


def assert_same_embeddings(x, y, n: int) -> None:
    """Each of the ``n`` sentences has the same token ids and embeddings (within EXACT) in ``x`` and
    ``y`` (``engine.Embedded``), wherever their batches put its rows."""
    import numpy as np

    for i in range(n):
        rows_x = slice(x.offsets[i], x.offsets[i] + x.lengths[i])
        rows_y = slice(y.offsets[i], y.offsets[i] + y.lengths[i])
        assert x.lengths[i] == y.lengths[i] and (x.flat[rows_x] - y.flat[rows_y]).abs().max().item() <= EXACT
        assert np.array_equal(x.tokens[rows_x], y.tokens[rows_y])


def test_embeddings_are_the_same_tokenized_ahead_or_first():
    """A GPU's batches are tokenized in a thread a batch ahead and their embeddings joined at the
    end; a CPU's are tokenized first and written into one tensor as they come (never held twice).
    Both ways give the same tensor, offsets and tokens (run here on the CPU)."""
    import torch

    from evalq.workers.metrics.bertscore.models import load_model

    model, tok = load_model(MODEL_DIR, LAYERS, False, False, "cpu", True)
    sentences = list(dict.fromkeys([i["actual-output"] for i in synthetic(150, 1, seed=11)] + ["", "x " * 600]))
    for all_layers in (False, True):
        first = bertscore_engine.embed(model, tok, sentences, "cpu", all_layers, max_batch_tokens=512, ahead=False)
        ahead = bertscore_engine.embed(model, tok, sentences, "cpu", all_layers, max_batch_tokens=512, ahead=True)
        assert first.flat.shape == ahead.flat.shape and not first.flat[-1].any()  # the padding row: zeros
        assert_same_embeddings(first, ahead, len(sentences))
        assert torch.isfinite(first.flat).all()


def test_a_batch_the_device_has_no_memory_for_is_split(caplog):
    """A GPU with less memory than a batch needs (a smaller card, long texts, another process on the
    device) raises OutOfMemoryError in the forward pass: the batch is split in two until its halves
    fit, with the same embeddings, and said in the log; one sentence that does not fit alone fails
    the chunk. A mock for what cannot run here: a model that raises the error CUDA's allocator
    raises (``torch.OutOfMemoryError``) above a number of tokens, on the CPU."""
    import torch

    from evalq.workers.metrics.bertscore.models import load_model

    model, tok = load_model(MODEL_DIR, LAYERS, False, False, "cpu", True)
    calls = []

    def small_device(batch, attention_mask=None, output_hidden_states=False):
        calls.append(batch.numel())
        if batch.numel() > 300:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (a mock)")
        return model(batch, attention_mask=attention_mask, output_hidden_states=output_hidden_states)

    sentences = list(dict.fromkeys(i["actual-output"] for i in synthetic(300, 1, seed=12)))
    for ahead in (False, True):
        whole = bertscore_engine.embed(model, tok, sentences, "cpu", max_batch_tokens=2048, ahead=ahead)
        calls.clear()
        with caplog.at_level("WARNING", logger="evalq.bertscore"):
            split = bertscore_engine.embed(small_device, tok, sentences, "cpu", max_batch_tokens=2048, ahead=ahead)
        assert max(calls) > 300 and "out of memory on cpu" in caplog.text  # it did fail, and was split
        assert caplog.text.count("out of memory") == 1  # said once, not per batch
        failed = [n for n in calls if n > 300]  # a 2,048-token batch fails thrice on its way to 256
        assert len(failed) <= 6 < len(calls) / 4  # later batches as large as one that failed: split untried
        caplog.clear()
        assert (split.lengths == whole.lengths).all()
        assert_same_embeddings(whole, split, len(sentences))
    with pytest.raises(torch.OutOfMemoryError):
        bertscore_engine.embed(small_device, tok, ["word " * 400], "cpu", ahead=False)


def test_long_pairs_are_matched_in_smaller_steps_with_the_same_values():
    """A matching step holds its pairs' embeddings and similarity matrices at its longest sentences:
    4,096 pairs of 500-token texts would need about 20 GB at once. Steps are cut to a budget of
    floats; every pair is matched on its own, so the values are the same whatever the steps (within
    float rounding: a step's sums run over its own padded width), with the zero-padding rule's groups
    and every layer too."""
    import numpy as np
    import torch

    torch.manual_seed(4)
    n, group, dim, layers = 60, 8, 16, 3
    lengths = [(int(torch.randint(2, 40, ())), int(torch.randint(2, 40, ()))) for _ in range(n)]
    lengths[7] = (300, 280)  # one long pair among short ones
    cand = [torch.nn.functional.normalize(torch.randn(lc, layers, dim), dim=-1) for lc, _ in lengths]
    ref = [torch.nn.functional.normalize(torch.randn(lr, layers, dim), dim=-1) for _, lr in lengths]
    cand_idf = [torch.cat([torch.zeros(1), torch.rand(len(c) - 2) + 0.1, torch.zeros(1)]) for c in cand]
    ref_idf = [torch.cat([torch.zeros(1), torch.rand(len(r) - 2) + 0.1, torch.zeros(1)]) for r in ref]
    whole = greedy_match(cand, ref, cand_idf, ref_idf, group, "cpu", all_layers=True)
    for budget in (1, 20_000, 300_000):
        steps = greedy_match(cand, ref, cand_idf, ref_idf, group, "cpu", all_layers=True, max_elements=budget)
        assert (steps - whole).abs().max().item() <= EXACT
    # the steps: every pair once, in order, each within the budget unless one pair alone exceeds it
    lh, lr = np.array([a for a, _ in lengths]), np.array([b for _, b in lengths])
    row = layers * dim
    for budget, most in ((20_000, 4096), (300_000, 4096), (10**9, 7)):
        cuts = list(bertscore_engine._steps(lh, lr, row, layers, most, budget))
        assert [a for a, _ in cuts] == [0] + [b for _, b in cuts[:-1]] and cuts[-1][1] == n
        for a, b in cuts:
            h, r = int(lh[a:b].max()), int(lr[a:b].max())
            assert b - a <= most and (b - a == 1 or (b - a) * ((h + r) * row + 3 * layers * h * r) <= budget)
    assert len(list(bertscore_engine._steps(lh, lr, row, layers, 4096, 20_000))) > 10  # it does cut
    empty = np.zeros(5, dtype=np.int64)  # a tokenizer that gives an empty text no token: still steps
    assert list(bertscore_engine._steps(empty, empty, row, layers, 4096, 20_000)) == [(0, 5)]


def test_best_of_references_is_the_per_instance_maximum_with_nan_kept():
    """Each instance's best over its references, value by value, as ``preds[a:b].max(dim=0)``:
    groups of one to four references, a NaN (bert-score's undefined P) that must stay NaN, every
    layer's rows too."""
    import torch

    from evalq.workers.metrics.bertscore.metric import best_of_references

    rng = random.Random(3)
    sizes = [rng.choice([1, 1, 2, 3, 4]) for _ in range(200)]
    groups, start = [], 0
    for size in sizes:
        groups.append((start, start + size))
        start += size
    for shape in ((start, 3), (start, 7, 3)):
        preds = torch.rand(shape) * 2 - 1
        preds[5, ..., 0] = float("nan")
        want = torch.stack([preds[a:b].max(dim=0)[0] for a, b in groups])
        got = best_of_references(preds, groups)
        assert got.shape == want.shape
        assert torch.equal(torch.isnan(got), torch.isnan(want)) and torch.isnan(want).any()
        assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(want))
    single = [(i, i + 1) for i in range(10)]
    preds = torch.rand(10, 3)
    assert torch.equal(best_of_references(preds, single), preds)


def test_a_cpus_batches_hold_one_token_length_unless_small():
    """On a CPU the sentences are tokenized first and batched by token length: a batch of one
    length has no padding and attention without a mask (a chunk of 500 short pairs was 5% padding
    before, and about 7% slower, BENCHMARKS.md). Only a batch still under an eighth of
    ``max_tokens`` takes shorter sentences; none is over ``max_tokens`` padded; each sentence once."""
    lengths = [600] + [30] * 40 + [20, 19, 18] + [10] * 50 + [4] * 3
    ids = [[7] * n for n in lengths]
    random.Random(5).shuffle(ids)
    batches = list(bertscore_engine._by_length(ids, 512))
    assert sorted(i for idx, _ in batches for i in idx) == list(range(len(ids)))
    shapes = []
    for idx, rows in batches:
        assert rows == [ids[i] for i in idx]
        shapes.append([len(r) for r in rows])
    assert shapes == [[600], [30] * 17, [30] * 17, [30] * 6,
                      [20, 19, 18] + [10] * 22,  # three lone lengths: 57 tokens, then the tens join them
                      [10] * 28, [4] * 3]  # 280 tokens of tens: the last length a batch of its own


@pytest.mark.parametrize("ahead", [False, True])
def test_embed_batches_as_the_metric_does_unless_asked(monkeypatch, ahead):
    """``embed`` and ``score`` take one default for a batch's padded tokens (``batch_tokens``:
    2,048 on a CPU, 65,536 on a GPU), whichever way the batches are formed; an asked size wins."""
    seen = []
    monkeypatch.setattr(bertscore_engine, "_by_length", lambda ids, most: seen.append(most) or iter(()))
    monkeypatch.setattr(bertscore_engine, "_batches", lambda sentences, most: seen.append(most) or [])
    monkeypatch.setattr(bertscore_engine, "_tokenized", lambda tok, sentences, batches: iter(()))
    monkeypatch.setattr(bertscore_engine, "encode", lambda tok, sentences, parallel=False: [[1, 2]])
    tok = types.SimpleNamespace(pad_token_id=0)  # no forward pass runs: no batch is formed
    bertscore_engine.embed(None, tok, ["a b"], "cpu", ahead=ahead)
    bertscore_engine.embed(None, tok, ["a b"], "cpu", max_batch_tokens=300, ahead=ahead)
    assert seen == [2048, 300]
    assert bertscore_engine.batch_tokens("cuda:1") == 65536 and bertscore_engine.batch_tokens("cuda", 300) == 300
