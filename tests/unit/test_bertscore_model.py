"""The gpu worker loads a BERTScore model as bert_score's ``get_model`` does, without importing the
bert_score package (whose ``__init__`` imports matplotlib and pandas): for every model family that
``get_model`` cuts its own way, a small model with random weights, loaded both ways, gives the same
layers and the same embeddings, bit for bit; and scoring through the engine leaves bert_score,
matplotlib and pandas unimported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
bert_score_utils = pytest.importorskip("bert_score.utils")

from evalq.workers.metrics.bertscore.models import get_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

# family -> (config class, model class, a tiny config with three layers); the branches of
# bert_score's get_model: encoder.layer (bert, roberta), transformer.layer (distilbert), albert's
# layer groups, xlnet's layer, xlm's n_layers, t5's encoder blocks (a path naming t5), an
# encoder-decoder's encoder layers (bart)
FAMILIES = {
    "bert": ("BertConfig", "BertModel", dict(vocab_size=100, hidden_size=16, num_hidden_layers=3,
                                              num_attention_heads=2, intermediate_size=32)),
    "roberta": ("RobertaConfig", "RobertaModel", dict(vocab_size=100, hidden_size=16, num_hidden_layers=3,
                                                       num_attention_heads=2, intermediate_size=32)),
    "distilbert": ("DistilBertConfig", "DistilBertModel", dict(vocab_size=100, dim=16, n_layers=3, n_heads=2,
                                                                hidden_dim=32)),
    "albert": ("AlbertConfig", "AlbertModel", dict(vocab_size=100, embedding_size=8, hidden_size=16,
                                                    num_hidden_layers=3, num_attention_heads=2,
                                                    intermediate_size=32)),
    "xlnet": ("XLNetConfig", "XLNetModel", dict(vocab_size=100, d_model=16, n_layer=3, n_head=2, d_inner=32)),
    "xlm": ("XLMConfig", "XLMModel", dict(vocab_size=100, emb_dim=16, n_layers=3, n_heads=2)),
    "t5": ("T5Config", "T5Model", dict(vocab_size=100, d_model=16, d_kv=8, d_ff=32, num_layers=3, num_heads=2)),
    "bart": ("BartConfig", "BartModel", dict(vocab_size=100, d_model=16, encoder_layers=3, decoder_layers=3,
                                              encoder_attention_heads=2, decoder_attention_heads=2,
                                              encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64)),
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("families")
    paths = {}
    for family, (config, model, kwargs) in FAMILIES.items():
        if not hasattr(transformers, model):
            continue
        torch.manual_seed(0)
        path = root / family  # "t5" in the path: both loaders take T5's encoder from it
        getattr(transformers, model)(getattr(transformers, config)(**kwargs)).save_pretrained(path)
        paths[family] = str(path)
    return paths


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("num_layers, all_layers", [(0, False), (2, False), (3, False), (2, True)])
def test_loaded_as_bert_score_loads_it(saved, family, num_layers, all_layers):
    if family not in saved:
        pytest.skip(f"this transformers has no {FAMILIES[family][1]}")
    path = saved[family]
    theirs = bert_score_utils.get_model(path, num_layers, all_layers)
    ours = get_model(path, num_layers, all_layers)
    assert type(ours) is type(theirs)
    assert str(ours) == str(theirs)  # the same modules: the same layers kept
    assert not ours.training
    ids = torch.randint(5, 100, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        expected = bert_score_utils.bert_encode(theirs, ids, mask, all_layers)
        got = bert_score_utils.bert_encode(ours, ids, mask, all_layers)
    assert got.shape == expected.shape
    assert torch.equal(got, expected)


def test_a_layer_beyond_the_model_is_refused(saved):
    with pytest.raises(ValueError, match="out of range: the model has 3 layers"):
        get_model(saved["bert"], 4, False)


def test_scoring_with_the_engine_imports_neither_bert_score_nor_matplotlib_nor_pandas():
    """idf's prepare step included; only ``engine: bert_score`` and the baseline's table need them."""
    code = ("import sys; from evalq.workers.metrics.bertscore.metric import bertscore, prepare; "
            "from evalq.shared.metrics.params import BertScoreParams; "
            "items = [{'actual-output': 'a cat sat', 'expected-output': ['the cat sat']}, "
            "{'actual-output': 'dogs run', 'expected-output': ['a dog ran fast']}]; "
            "p = BertScoreParams(idf=True); "
            "r = bertscore(items, p, prepare(items, p)); "
            "assert all(0 < x['f1'] <= 1 for x in r), r; "
            "print(sorted(m for m in ('bert_score', 'matplotlib', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
