"""A BERT or RoBERTa model and its tokenizer for the BERTScore engine, loaded without transformers.

Importing transformers' BERT costs a cold gpu worker about 2 s on one core (its tokenizer
classes 0.65 s; its modelling modules 1.4 s more, which import torch.distributed.tensor,
torch._dynamo and scipy whether a model needs them or not), a third of a cold ``evalq run``.
A BERT encoder is a few torch functions, so for a model directory that is plainly a BERT or a
RoBERTa (``model_type: bert`` or ``roberta``, absolute positions, GELU, float32 weights in
``model.safetensors``, a Rust ``tokenizer.json`` whose settings agree with
``tokenizer_config.json``) the engine builds both here from the same files: the same embeddings,
layers and scaled-dot-product attention as transformers' ``BertModel``/``RobertaModel`` with their
default (SDPA) attention, and the same token ids as ``AutoTokenizer``.
Anything else (another family, a setting this module does not read, ``engine: bert_score``)
goes through transformers as before. tests/unit/test_bertscore_native.py holds the hidden
states equal to transformers' and the ids equal to ``AutoTokenizer``'s; the engine's tests
against ``BERTScorer`` run through this path. ``EVALQ_BERTSCORE_NATIVE=0`` turns it off.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

ENV = "EVALQ_BERTSCORE_NATIVE"
# per family: the tokenizer classes whose tokenizer.json is read here, and the special tokens'
# defaults (transformers' own, for a tokenizer_config.json that names none)
FAMILIES = {
    "bert": ((None, "BertTokenizer", "BertTokenizerFast"),
             {"cls": "[CLS]", "sep": "[SEP]", "pad": "[PAD]", "unk": "[UNK]"}),
    "roberta": ((None, "RobertaTokenizer", "RobertaTokenizerFast"),
                {"cls": "<s>", "sep": "</s>", "pad": "<pad>", "unk": "<unk>"}),
}


def _read(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _float32_safetensors(file: Path) -> bool:
    """Whether ``file`` is a safetensors file whose floating-point tensors are all float32 (read
    from its header: 8 bytes of length, then JSON naming each tensor's dtype)."""
    try:
        with file.open("rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size)) if 0 < size < 1 << 26 else {}
    except (OSError, ValueError):
        return False
    dtypes = {v.get("dtype") for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)}
    return bool(dtypes) and dtypes <= {"F32", "I64", "I32"}


def unsupported(path: str) -> str | None:
    """Why the model at ``path`` is loaded through transformers (None: it is loaded here)."""
    if os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return f"{ENV} is off"
    folder = Path(path)
    config, tok_config = _read(folder / "config.json"), _read(folder / "tokenizer_config.json")
    family = config.get("model_type")
    checks = {
        "model_type is neither bert nor roberta": family not in FAMILIES,
        "not absolute positions": config.get("position_embedding_type", "absolute") != "absolute",
        "activation is not gelu": config.get("hidden_act", "gelu") != "gelu",
        "a decoder": bool(config.get("is_decoder") or config.get("add_cross_attention")),
        "chunked feed-forward": bool(config.get("chunk_size_feed_forward")),
        "no float32 model.safetensors": not _float32_safetensors(folder / "model.safetensors"),
        "no tokenizer.json": not (folder / "tokenizer.json").is_file(),
        "another tokenizer class": tok_config.get("tokenizer_class") not in FAMILIES.get(family, ((),))[0],
        "no model_max_length": not isinstance(tok_config.get("model_max_length"), int),
    }
    for reason, failed in checks.items():
        if failed:
            return reason
    rust = _read(folder / "tokenizer.json")
    if family == "bert":
        wanted = {"type": "BertNormalizer", "lowercase": tok_config.get("do_lower_case", True),
                  "strip_accents": tok_config.get("strip_accents"),
                  "handle_chinese_chars": tok_config.get("tokenize_chinese_chars", True)}
        if any((rust.get("normalizer") or {}).get(k) != v for k, v in wanted.items()):
            return "tokenizer.json's normalizer differs from tokenizer_config.json"
    else:  # byte-level BPE: the prefix space as tokenizer_config.json says, <s> ... </s> around
        prefix = tok_config.get("add_prefix_space", False)
        pre, post = rust.get("pre_tokenizer") or {}, rust.get("post_processor") or {}
        if (pre.get("type"), pre.get("add_prefix_space"), post.get("type")) != \
                ("ByteLevel", prefix, "RobertaProcessing"):
            return "tokenizer.json's byte-level settings differ from tokenizer_config.json"
    try:
        tokenizer = Tokenizer(path)
    except Exception as exc:  # noqa: BLE001 - any doubt: transformers reads it
        return f"its tokenizer: {exc}"
    if family == "roberta" and tokenizer.pad_token_id != config.get("pad_token_id", 1):
        return "the padding token is not the model's (RoBERTa counts positions from it)"
    return None


class Tokenizer:
    """What the engine reads of a transformers tokenizer, over the Rust tokenizer of
    ``tokenizer.json``: ``_tokenizer``, the special tokens' ids, ``model_max_length``, and a
    call giving ``input_ids`` as ``tokenizer(texts, add_special_tokens=True, max_length=...,
    truncation=True)`` gives them."""

    truncation_side = "right"

    def __init__(self, path: str):
        from tokenizers import Tokenizer as Rust

        folder = Path(path)
        config = _read(folder / "tokenizer_config.json")
        specials = _read(folder / "special_tokens_map.json")
        defaults = FAMILIES.get(_read(folder / "config.json").get("model_type"), FAMILIES["bert"])[1]
        self._tokenizer = Rust.from_file(str(folder / "tokenizer.json"))
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        self.model_max_length = int(config["model_max_length"])
        for role, default in defaults.items():
            token = config.get(f"{role}_token") or specials.get(f"{role}_token") or default
            if isinstance(token, dict):  # {"content": "[CLS]", ...}
                token = token.get("content", default)
            setattr(self, f"{role}_token", token)
            setattr(self, f"{role}_token_id", self._tokenizer.token_to_id(token))
        if self.cls_token_id is None or self.sep_token_id is None:
            raise ValueError(f"{path}: tokenizer.json has no {self.cls_token!r} or {self.sep_token!r} token")

    def __call__(self, texts: list[str], add_special_tokens: bool = True, max_length: int | None = None,
                 truncation: bool = False) -> dict[str, list[list[int]]]:
        rust = self._tokenizer
        if truncation and max_length is not None:
            from tokenizers import Tokenizer as Rust

            rust = Rust.from_str(rust.to_str())
            rust.enable_truncation(max_length)
        single = isinstance(texts, str)
        out = [e.ids for e in rust.encode_batch([texts] if single else texts, add_special_tokens=add_special_tokens)]
        return {"input_ids": out[0] if single else out}

    def build_inputs_with_special_tokens(self, token_ids_0: list[int], token_ids_1: list[int] | None = None):
        if token_ids_1 is not None:
            raise NotImplementedError("only bert-score's single-sentence call is supported")
        return [self.cls_token_id, *token_ids_0, self.sep_token_id]


def _state_dict(path: str) -> dict[str, Any]:
    """The checkpoint's tensors, named as ``BertModel``'s (a ``bert.`` or ``roberta.`` prefix of a
    pre-training checkpoint dropped, old ``gamma``/``beta`` layer-norm names read as
    ``weight``/``bias``)."""
    from safetensors.torch import load_file

    out = {}
    for name, tensor in load_file(str(Path(path) / "model.safetensors")).items():
        for prefix in ("bert.", "roberta."):
            name = name[len(prefix):] if name.startswith(prefix) else name
        name = name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        out[name] = tensor
    return out


def load_model(path: str, num_layers: int, all_layers: bool):
    """The model at ``path`` as ``Bert``: its first ``num_layers`` layers (all with
    ``all_layers``, every layer's states then returned), as bert_score cuts a BERT or a RoBERTa."""
    import torch

    config = _read(Path(path) / "config.json")
    total = int(config["num_hidden_layers"])
    if not all_layers and not 0 <= num_layers <= total:
        raise ValueError(f"num_layers {num_layers} is out of range: the model has {total} layers")
    model = _bert_class()(config, total if all_layers else num_layers, all_layers)
    state = _state_dict(path)
    names = {ours: hf_name(ours) for ours in model.state_dict()}
    missing = [hf for hf in names.values() if hf not in state]
    if missing:
        raise ValueError(f"{path}: the weights lack {missing[:3]}")
    if any(state[hf].dtype != torch.float32 for hf in names.values()):
        raise ValueError(f"{path}: weights that are not float32")
    model.load_state_dict({ours: state[hf] for ours, hf in names.items()})
    return model.eval()


_BERT: list = []


def _bert_class():
    """``Bert``, defined on first use so that importing this module does not import torch."""
    if _BERT:
        return _BERT[0]
    import torch
    from torch import nn
    from torch.nn import functional as F

    # Every parameter comes from the checkpoint (``load_state_dict`` is strict: a missing one
    # raises), so none is initialised first: a MiniLM's random initialisation (its 30,522-word
    # embedding above all) took 0.12 s of a cold worker's model load.
    class Linear(nn.Linear):
        def reset_parameters(self) -> None:
            pass

    class Embedding(nn.Embedding):
        def reset_parameters(self) -> None:
            pass

    class LayerNorm(nn.LayerNorm):
        def reset_parameters(self) -> None:
            pass

    _gelu_ = torch.ops.aten.gelu_  # F.gelu, in place (exact erf form, as BertModel's "gelu")

    class Layer(nn.Module):
        def __init__(self, d: int, ffn: int, heads: int, eps: float):
            super().__init__()
            self.heads, self.eps = heads, eps
            self.q, self.k, self.v, self.o = (Linear(d, d) for _ in range(4))
            self.ln1, self.ln2 = LayerNorm(d, eps=eps), LayerNorm(d, eps=eps)
            self.up, self.down = Linear(d, ffn), Linear(ffn, d)

        def forward(self, h, mask):
            b, t, d = h.shape
            split = (b, t, self.heads, d // self.heads)
            q, k, v = (proj(h).view(split).transpose(1, 2) for proj in (self.q, self.k, self.v))
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, scale=(d // self.heads) ** -0.5,
                                               is_causal=False)
            a = a.transpose(1, 2).contiguous().reshape(b, t, d).contiguous()
            a = self.ln1(self.o(a) + h)
            # GELU in place: the same values, and no second [tokens, intermediate] tensor, whose
            # allocation beside the first made glibc hand its heap's top back and fault it in again
            # layer after layer on a CPU (MiniLM on 2 cores: ~7% of the engine's time; BENCHMARKS.md).
            return self.ln2(self.down(_gelu_(self.up(a))) + a)

    class Bert(nn.Module):
        """transformers' ``BertModel`` (or ``RobertaModel``) forward (eval mode, SDPA attention,
        no pooler);
        ``hf_name`` names its parameters as ``BertModel``'s."""

        def __init__(self, config: dict, layers: int, all_layers: bool):
            super().__init__()
            d, eps = config["hidden_size"], config.get("layer_norm_eps", 1e-12)
            self.all_layers = all_layers
            # RoBERTa numbers positions from its padding token's id + 1, padding at that id
            self.padding_idx = config.get("pad_token_id", 1) if config.get("model_type") == "roberta" else None
            self.word = Embedding(config["vocab_size"], d)
            self.position = Embedding(config["max_position_embeddings"], d)
            self.token_type = Embedding(config.get("type_vocab_size", 2), d)
            self.ln = LayerNorm(d, eps=eps)
            self.layers = nn.ModuleList(Layer(d, config["intermediate_size"], config["num_attention_heads"], eps)
                                        for _ in range(layers))

        def forward(self, input_ids, attention_mask=None, output_hidden_states: bool = False):
            b, t = input_ids.shape
            h = self.word(input_ids) + self.token_type.weight[0]  # token type 0 everywhere, as BertModel
            if self.padding_idx is None:
                h = self.ln(h + self.position.weight[:t])
            else:  # RobertaEmbeddings' create_position_ids_from_input_ids
                real = input_ids.ne(self.padding_idx).int()
                positions = (torch.cumsum(real, dim=1).type_as(real) * real).long() + self.padding_idx
                h = self.ln(h + self.position(positions))
            # the padding mask as transformers gives SDPA one: [b, 1, t, t], contiguous (the same
            # kernel on every device), True where a key is attended; none where nothing is padded
            mask = None
            if attention_mask is not None and not bool(attention_mask.all()):
                mask = attention_mask.bool()[:, None, None, :].expand(b, 1, t, t).contiguous()
            states = [h]
            for layer in self.layers:
                h = layer(h, mask)
                states.append(h)
            return (h, tuple(states)) if output_hidden_states or self.all_layers else (h,)

    _BERT.append(Bert)
    return Bert


def hf_name(name: str) -> str:
    """A parameter's name here -> its name in ``BertModel`` (and its checkpoints)."""
    head, _, rest = name.partition(".")
    if head != "layers":
        return {"word.weight": "embeddings.word_embeddings.weight",
                "position.weight": "embeddings.position_embeddings.weight",
                "token_type.weight": "embeddings.token_type_embeddings.weight",
                "ln.weight": "embeddings.LayerNorm.weight", "ln.bias": "embeddings.LayerNorm.bias"}[name]
    index, _, leaf = rest.partition(".")
    module, _, kind = leaf.partition(".")
    where = {"q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
             "o": "attention.output.dense", "ln1": "attention.output.LayerNorm", "up": "intermediate.dense",
             "down": "output.dense", "ln2": "output.LayerNorm"}[module]
    return f"encoder.layer.{index}.{where}.{kind}"
