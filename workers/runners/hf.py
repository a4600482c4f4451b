"""A local Hugging Face causal LM as the model under test: the runner fmeval's documentation
builds (seed 003, ``HuggingFaceCausalLLMModelRunner``), loading only from local files.

``{"model": {"runner": "evalq.workers.runners.hf:HFCausalLM", "parameters": {"model_name":
"/models/SmolLM2-135M-Instruct", "gguf_file": "model.Q4_1.gguf", "max_new_tokens": 64}}}``

``predict(prompt)`` generates (greedy, ``max_new_tokens``) and returns the prompt's
log-probability beside the output, as the seed computes it: minus the model's mean token loss
over ``bos_token + prompt``. ``log_probability(prompt)`` gives only that (one forward pass, no
generation): prompt_stereotyping asks for nothing else. A GGUF file (``gguf_file``) is
de-quantized by transformers (it needs the ``gguf`` package).

Jobs may name it only where the operator loads this module (``EVALQ_PLUGINS``): it puts on the
worker whatever model a job's ``model_name`` names. So its parameters are typed and bounded
(``HFCausalLMParams``): ``model_name`` is a local directory (in a queue request, under its
tenant's roots, ``EVALQ_REQUEST_ROOTS``/``EVALQ_SHARED_ROOTS``), ``gguf_file`` a file name in
it, ``max_new_tokens`` at most ``evalq.shared.core.bounds.MAX_NEW_TOKENS``, ``device`` cpu or cuda.
"""

from __future__ import annotations

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
        extra = {"gguf_file": gguf_file} if gguf_file else {}
        self.tokenizer = AutoTokenizer.from_pretrained(model_name, local_files_only=True, **extra)
        self.model = AutoModelForCausalLM.from_pretrained(model_name, local_files_only=True, **extra).to(device)
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
