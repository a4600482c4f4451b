"""The engine's BERT and RoBERTa built without transformers (workers/metrics/bertscore/native.py)
against transformers itself, computed here: hidden states of ``BertModel`` (every layer, padded and
unpadded batches, a pre-training checkpoint's ``bert.`` names), token ids of ``AutoTokenizer``
(accents, CJK, control characters, empty and over-long texts, a cased tokenizer), which models
it takes and which it leaves to transformers, and a scoring process that never imports
transformers. The engine's equality with ``BERTScorer`` (test_bertscore_engine.py) runs through
this path for the shipped model."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from evalq.shared.metrics import bertscore as models
from evalq.workers.metrics.bertscore import native
from evalq.workers.metrics.bertscore.models import native_ok

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

MODEL_DIR = models.bundled_model_dir()
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
TEXTS = ["The cat sat on the mat.", "A much longer sentence, with punctuation; and MIXED case words!", "hi",
         "Café naïve résumé über", "中文字符 mixed with English", "tab\there\x00nul \u200b zero-width", "",
         "   spaced   out   ", "emoji 🙂 and symbols ©®", " ".join(["token"] * 700)]


def _random_bert(folder, cls=None):
    """A small BERT with random weights (seeded) and the shipped tokenizer files, saved as
    transformers saves it."""
    torch.manual_seed(0)
    base = json.loads(Path(MODEL_DIR, "config.json").read_text())
    base.update(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, intermediate_size=128)
    cfg = transformers.BertConfig(**{k: v for k, v in base.items() if not k.startswith("_")})
    model = (cls or transformers.BertModel)(cfg).eval()
    model.save_pretrained(folder, safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copy(f"{MODEL_DIR}/{name}", folder / name)
    return folder


def _batch(tokenizer, texts):
    enc = tokenizer(texts, padding=True, truncation=True, max_length=64, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


@pytest.mark.parametrize("layers", [0, 2, 4])
def test_hidden_states_equal_bert_models(tmp_path, layers):
    folder = _random_bert(tmp_path / "m")
    theirs = transformers.AutoModel.from_pretrained(folder).eval()
    ours = native.load_model(str(folder), layers, all_layers=False)
    ids, mask = _batch(transformers.AutoTokenizer.from_pretrained(folder), TEXTS[:6])
    real = mask.bool()
    with torch.inference_mode():
        want = theirs(ids, attention_mask=mask, output_hidden_states=True).hidden_states[layers]
        got = ours(ids, attention_mask=mask)[0]
        assert got.shape == want.shape
        assert (got - want)[real].abs().max().item() <= 1e-6
        # one length, nothing to mask: the unmasked path
        same = ids[:1, :7]
        want = theirs(same, output_hidden_states=True).hidden_states[layers]
        assert (ours(same)[0] - want).abs().max().item() <= 1e-6


def test_every_layer_and_a_pre_training_checkpoint(tmp_path):
    folder = _random_bert(tmp_path / "pre", cls=transformers.BertForMaskedLM)
    with open(folder / "model.safetensors", "rb") as f:  # saved with bert.-prefixed names and a head
        assert b"bert.encoder.layer.0" in f.read(1 << 16)
    theirs = transformers.AutoModel.from_pretrained(folder).eval()
    ours = native.load_model(str(folder), 0, all_layers=True)
    ids, mask = _batch(transformers.AutoTokenizer.from_pretrained(folder), TEXTS[:4])
    with torch.inference_mode():
        want = theirs(ids, attention_mask=mask, output_hidden_states=True).hidden_states
        got = ours(ids, attention_mask=mask, output_hidden_states=True)[-1]
    assert len(got) == len(want) == 5
    real = mask.bool()
    assert max((g - w)[real].abs().max().item() for g, w in zip(got, want)) <= 1e-6
    with pytest.raises(ValueError, match="out of range"):
        native.load_model(str(folder), 5, all_layers=False)


def test_token_ids_equal_auto_tokenizers(tmp_path):
    theirs = transformers.AutoTokenizer.from_pretrained(MODEL_DIR)
    ours = native.Tokenizer(MODEL_DIR)
    limit = theirs.model_max_length
    assert ours.model_max_length == limit
    assert (ours.cls_token_id, ours.sep_token_id, ours.pad_token_id) == \
        (theirs.cls_token_id, theirs.sep_token_id, theirs.pad_token_id)
    assert ours(TEXTS, max_length=limit, truncation=True)["input_ids"] == \
        theirs(TEXTS, add_special_tokens=True, max_length=limit, truncation=True)["input_ids"]
    assert ours.build_inputs_with_special_tokens([]) == theirs("", add_special_tokens=True)["input_ids"]
    # a cased tokenizer: both files say so, and the ids keep the case as AutoTokenizer's do
    cased = tmp_path / "cased"
    cased.mkdir()
    for name in TOKENIZER_FILES + ("config.json", "model.safetensors"):
        shutil.copy(f"{MODEL_DIR}/{name}", cased / name)
    tok_json = json.loads((cased / "tokenizer.json").read_text())
    tok_json["normalizer"]["lowercase"] = False
    (cased / "tokenizer.json").write_text(json.dumps(tok_json))
    tok_config = json.loads((cased / "tokenizer_config.json").read_text())
    (cased / "tokenizer_config.json").write_text(json.dumps({**tok_config, "do_lower_case": False}))
    assert native.unsupported(str(cased)) is None
    theirs = transformers.AutoTokenizer.from_pretrained(cased)
    got = native.Tokenizer(str(cased))(TEXTS, max_length=limit, truncation=True)["input_ids"]
    assert got == theirs(TEXTS, add_special_tokens=True, max_length=limit, truncation=True)["input_ids"]
    assert got[1] != ours(TEXTS[1:2])["input_ids"][0]  # MIXED is not mixed
    # the two files disagree: transformers decides, not this module
    (cased / "tokenizer_config.json").write_text(json.dumps(tok_config))
    assert "normalizer" in native.unsupported(str(cased))


def test_which_models_are_built_here(tmp_path, monkeypatch):
    assert native.unsupported(MODEL_DIR) is None
    assert native_ok(MODEL_DIR, "evalq") and not native_ok(MODEL_DIR, "bert_score")
    monkeypatch.setenv(native.ENV, "0")
    assert native.unsupported(MODEL_DIR) == f"{native.ENV} is off" and not native_ok(MODEL_DIR, "evalq")
    monkeypatch.delenv(native.ENV)
    folder = _random_bert(tmp_path / "m")
    assert native.unsupported(str(folder)) is None
    config = json.loads((folder / "config.json").read_text())
    for change, reason in [({"model_type": "distilbert"}, "model_type"), ({"hidden_act": "relu"}, "gelu"),
                           ({"position_embedding_type": "relative_key"}, "absolute"),
                           ({"is_decoder": True}, "decoder")]:
        (folder / "config.json").write_text(json.dumps({**config, **change}))
        assert reason in native.unsupported(str(folder))
    (folder / "config.json").write_text(json.dumps(config))
    tok_config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**tok_config, "cls_token": "[NOPE]"}))
    assert "[NOPE]" in native.unsupported(str(folder))
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config))
    half = transformers.AutoModel.from_pretrained(folder).half()
    half.save_pretrained(folder, safe_serialization=True)
    assert "float32" in native.unsupported(str(folder))
    (folder / "model.safetensors").unlink()
    assert "safetensors" in native.unsupported(str(folder))


def test_scoring_the_shipped_model_never_imports_transformers():
    """What makes a cold gpu worker 2 s faster: the engine's whole path (model, tokenizer, idf,
    matching) in a fresh process, and transformers still not imported at the end."""
    code = """
import sys
from evalq.shared.metrics.params import BertScoreParams
from evalq.workers.metrics.bertscore.metric import bertscore, prepare
insts = [{"actual-output": "a cat sat", "expected-output": ["the cat sat", "a dog"]},
         {"actual-output": "", "expected-output": ["nothing"]}]
params = BertScoreParams.model_validate({"idf": True})
out = bertscore(insts, params, prepare(insts, params))
assert out[0]["f1"] > 0.5 and out[1]["f1"] == 0.0, out
print(sorted(m for m in sys.modules if m.split(".")[0] in ("transformers", "bert_score")))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize("add_prefix_space", [False, True])
def test_a_roberta_is_built_here_equal_to_roberta_model_and_bertscorer(tmp_path, add_prefix_space):
    """RoBERTa (bert_score's default English family): positions counted from the padding token,
    byte-level BPE ids as bert_score's ``sent_encode`` gives them (a tokenizer trained in the test:
    none ships offline), and the engine's F1 through this path equal to ``BERTScorer``'s."""
    from bert_score import BERTScorer
    from bert_score.utils import sent_encode

    from tests.unit.test_bertscore import run as evalq_scores
    from tests.unit.test_bertscore_engine import _roberta_tokenizer, cands, refs, synthetic

    folder = Path(_roberta_tokenizer(tmp_path / "roberta", add_prefix_space))
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    torch.manual_seed(0)
    config = transformers.RobertaConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                                        intermediate_size=128, max_position_embeddings=66, pad_token_id=1,
                                        type_vocab_size=1)
    transformers.RobertaModel(config).eval().save_pretrained(folder, safe_serialization=True)
    assert native.unsupported(str(folder)) is None
    theirs = transformers.AutoModel.from_pretrained(folder).eval()
    ours = native.load_model(str(folder), 3, all_layers=False)
    ids, mask = _batch(tok, ["The city music", "garden window morning letter market doctor answer", "A"])
    with torch.inference_mode():
        want, got = theirs(ids, attention_mask=mask)[0], ours(ids, attention_mask=mask)[0]
    assert (got - want)[mask.bool()].abs().max().item() <= 1e-6
    texts = ["  Padded text.  ", "The city music", "garden " * 100, "Ünïcode ok"]
    ours_tok = native.Tokenizer(str(folder))
    assert ours_tok([t.strip() for t in texts], max_length=64, truncation=True)["input_ids"] == \
        [sent_encode(tok, t) for t in texts]
    data = synthetic(10, 2, seed=5)
    P, R, F = BERTScorer(model_type=str(folder), num_layers=2, device="cpu", nthreads=0).score(cands(data), refs(data))
    scores = evalq_scores(data, model_type=str(folder), num_layers=2)
    assert max(abs(s["f1"] - f) for s, f in zip(scores, F.tolist())) <= 1e-6
    # a tokenizer_config.json that says otherwise of the prefix space: transformers decides
    tok_config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**tok_config, "add_prefix_space": not add_prefix_space}))
    assert "byte-level" in native.unsupported(str(folder))
