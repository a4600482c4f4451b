"""A local Hugging Face causal LM as the model under test: the runner fmeval's documentation
builds (seed 003, ``HuggingFaceCausalLLMModelRunner``), loading only from local files.

``{"model": {"runner": "evalq.workers.runners.hf:HFCausalLM", "parameters": {"model_name":
"/models/SmolLM2-135M-Instruct", "gguf_file": "model.Q4_1.gguf", "max_new_tokens": 64}}}``

``predict(prompt)`` generates (greedy, ``max_new_tokens``) and returns the prompt's
log-probability beside the output, as the seed computes it: minus the model's mean token loss
over ``bos_token + prompt``. ``log_probability(prompt)`` gives only that (one forward pass, no
generation): prompt_stereotyping asks for nothing else. A GGUF file (``gguf_file``) is
de-quantized by transformers (it needs the ``gguf`` package): 30 to 40 s of parsing for a 135M
model, in every process that loads it. So the de-quantized model (fp32 weights, config, tokenizer)
is kept once in ``<EVALQ_CACHE_DIR>/gguf/`` (keyed by the file's path, size and time) and later loads
read it (under a second); ``EVALQ_GGUF_CACHE=0`` turns that off. The values are the same: the weights
are the tensors transformers de-quantized, saved unchanged.

Jobs may name it only where the operator loads this module (``EVALQ_PLUGINS``): it puts on the
worker whatever model a job's ``model_name`` names. So its parameters are typed and bounded
(``HFCausalLMParams``): ``model_name`` is a local directory (in a queue request, under its
tenant's roots, ``EVALQ_REQUEST_ROOTS``/``EVALQ_SHARED_ROOTS``), ``gguf_file`` a file name in
it, ``max_new_tokens`` at most ``evalq.shared.core.bounds.MAX_NEW_TOKENS``, ``device`` cpu or cuda.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Literal

from pydantic import Field, field_validator

from evalq.shared.core import bounds
from evalq.shared.model.runners import ModelRunner
from evalq.shared.core.strict import Params
from evalq.shared.policy.egress import local_path


class HFCausalLMParams(Params):
    model_name: str = Field(max_length=bounds.MAX_PATH_CHARS,
                            description="a local directory with the model's config, tokenizer and weights")
    gguf_file: str | None = Field(default=None, max_length=255, pattern=r"^[\w][\w.+-]*\.gguf$",
                                  description="a GGUF file in model_name (its name, not a path)")
    max_new_tokens: int = Field(default=64, ge=1, le=bounds.MAX_NEW_TOKENS, description="tokens generated per prompt")
    seed: int = Field(default=0, ge=0, le=2**32 - 1)
    remove_prompt_from_generated_text: bool = True
    device: str = Field(default="cpu", pattern=r"^(cpu|cuda(:\d{1,2})?)$", max_length=bounds.MAX_DEVICE_CHARS)
    log_probability: Literal["mean", "sum"] = "mean"

    @field_validator("model_name")
    @classmethod
    def _local_directory(cls, value, info):
        return local_path(value, info, "directory")


class HFCausalLM(ModelRunner):
    gives_log_probability = True
    Parameters = HFCausalLMParams

    def __init__(self, model_name: str, max_new_tokens: int = 64, gguf_file: str | None = None, seed: int = 0,
                 remove_prompt_from_generated_text: bool = True, device: str = "cpu",
                 log_probability: str = "mean"):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local files only, whatever is asked
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if log_probability not in ("mean", "sum"):
            raise ValueError("log_probability must be 'mean' (the seed's: minus the mean token loss) or 'sum'")
        torch.manual_seed(seed)
        cached = _gguf_cache(model_name, gguf_file) if gguf_file else None
        if cached is not None and (cached / _COMPLETE).exists():
            model_name, gguf_file = str(cached), None
        extra = {"gguf_file": gguf_file} if gguf_file else {}
        with _gguf_read_once() if gguf_file else contextlib.nullcontext():
            self.tokenizer = AutoTokenizer.from_pretrained(model_name, local_files_only=True, **extra)
            self.model = AutoModelForCausalLM.from_pretrained(model_name, local_files_only=True, **extra).to(device)
        if gguf_file and cached is not None:
            _keep(self.model, self.tokenizer, cached)
        self.model.eval()
        self.max_new_tokens = max_new_tokens
        self.remove_prompt = remove_prompt_from_generated_text
        self.device = device
        self.total = log_probability == "sum"

    def predict(self, prompt: str) -> tuple[str | None, float | None]:
        import torch

        inputs = self.tokenizer(prompt, return_tensors="pt").to(self.device)
        with torch.inference_mode():
            generations = self.model.generate(**inputs, max_new_tokens=self.max_new_tokens, do_sample=False,
                                              pad_token_id=self.tokenizer.eos_token_id)
        n = inputs["input_ids"].shape[1]
        contains_prompt = bool((inputs["input_ids"][0] == generations[0][:n]).all())
        if self.remove_prompt and not contains_prompt:
            warnings.warn("the model does not return the prompt in its generations: "
                          "remove_prompt_from_generated_text does nothing")
        kept = generations[:, n:] if self.remove_prompt and contains_prompt else generations
        output = self.tokenizer.batch_decode(kept, skip_special_tokens=True)[0]
        return output, self.log_probability(prompt)

    def log_probability(self, prompt: str) -> float:
        import torch

        ids = self.tokenizer((self.tokenizer.bos_token or "") + prompt, return_tensors="pt")["input_ids"].to(self.device)
        with torch.inference_mode():
            loss = self.model(ids, labels=ids)[0].item()
        return -loss * (ids.shape[1] - 1) if self.total else -loss


_COMPLETE = "evalq-complete"


def _gguf_cache(model_name: str, gguf_file: str):
    """Where the de-quantized form of ``model_name/gguf_file`` is kept, or None (the cache is off,
    or the file cannot be read: transformers will say why)."""
    import hashlib
    from pathlib import Path

    from evalq.shared.core.config import cache_dir

    if os.environ.get("EVALQ_GGUF_CACHE", "1").strip() in ("0", "false", "no", "off"):
        return None
    path = Path(model_name, gguf_file).resolve()
    try:
        st = path.stat()
    except OSError:
        return None
    key = hashlib.sha256(f"{path}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:32]
    return cache_dir() / "gguf" / key


def _keep(model, tokenizer, target) -> None:
    """Save the de-quantized model beside its config and tokenizer, whole or not at all: written in
    a folder of its own, then renamed (two processes converting at once: the first rename wins). A
    disk without room leaves no cache, and the model loaded from the GGUF file is used as it is."""
    import shutil
    import tempfile

    from safetensors.torch import save_model

    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        work = tempfile.mkdtemp(prefix=".partial-", dir=target.parent)
    except OSError:
        return
    try:
        config = model.config.to_dict()
        config.pop("quantization_config", None)  # plain weights now: loaded as any checkpoint
        type(model.config).from_dict(config).save_pretrained(work)
        save_model(model, os.path.join(work, "model.safetensors"))  # tied weights saved once
        tokenizer.save_pretrained(work)
        open(os.path.join(work, _COMPLETE), "w").close()
        os.rename(work, target)
    except Exception as exc:  # noqa: BLE001 - a cache that cannot be written is no reason to fail the load
        import logging

        logging.getLogger("evalq.worker").info("the de-quantized model was not cached in %s: %s", target, exc)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def _gguf_read_once():
    """While a GGUF file is loaded: transformers parses it three times (tokenizer, config, weights;
    10 s each for SmolLM2-135M, most of it the tokenizer's 49k strings) and builds the same tensor
    name map once per module (397 times, 12 s): here each is made once and reused, and given up
    after. Both are looked up in the ``gguf`` package at each call, which is what is replaced."""
    import functools

    try:
        import gguf
    except ImportError:  # transformers says it is missing
        yield
        return
    reader, name_map = getattr(gguf, "GGUFReader", None), getattr(gguf, "get_tensor_name_map", None)
    if reader is None or name_map is None:  # another gguf: loaded as transformers does it
        yield
        return
    gguf.GGUFReader = functools.lru_cache(maxsize=2)(reader)
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=8)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map
