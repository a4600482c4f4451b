"""One chat-completions request as both paths read it: the synchronous endpoint
(``handler``) and a batch line (``batches``) validate a body, build its reply and
write the completion with the same functions, so the two answer a body alike."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from evalq.sim.faults import INJECTED_RETRY_AFTER_S, Markers, parse_markers
from evalq.sim.replies import BadRequest, build_choice
from evalq.sim.tokens import count_prompt_tokens

ERROR500_MESSAGE = ("The server had an error while processing your request. Sorry about that! "
                    "(judge-sim injected)")
INJECTED_429_MESSAGE = (f"Rate limit reached (judge-sim injected). Please retry after "
                        f"{INJECTED_RETRY_AFTER_S} second.")


@dataclass(frozen=True)
class ChatRequest:
    """A valid chat-completions body, read. ``key`` is the sha256 of the body with its
    model (for Azure: the deployment), the request's identity for ``-once`` faults and
    ``JudgeSim.answered``."""

    body: dict
    model: str
    messages: list
    max_tokens: int | None
    n: int
    markers: Markers
    reply: tuple[dict, str, int]  # (message, finish_reason, completion tokens of one choice)
    key: str
    prompt_tokens: int

    def cost(self, default_max_tokens: int) -> int:
        """Admission cost, as Azure OpenAI counts it: prompt + max_tokens * n."""
        return self.prompt_tokens + (self.max_tokens or default_max_tokens) * self.n

    def malformed_reply(self) -> tuple[dict, str, int]:
        return build_choice(self.body, self.model, self.messages, self.markers, True, self.max_tokens)


def read_chat(body: Any, deployment: str | None = None, judged: Any = None) -> ChatRequest:
    """Validate a decoded JSON body; raises :class:`BadRequest` as the API answers 400. ``judged``:
    the sim's ``(model) -> (Biases or None, seed)`` (``evalq.sim.pairwise``)."""
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    model = deployment or body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("you must provide a model parameter", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise BadRequest("'messages' must be a non-empty array of objects with a 'role'.", "messages")
    if body.get("stream"):
        raise BadRequest("judge-sim does not support stream=true.", "stream")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
                                   or max_tokens < 1):
        raise BadRequest("max_tokens must be a positive integer.", "max_tokens")
    n = body.get("n", 1)
    if n is None:
        n = 1
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 128:
        raise BadRequest("n must be an integer between 1 and 128.", "n")
    markers = parse_markers(messages)
    # a pure function of the request: an invalid one is refused before admission
    biases, seed = judged(model) if judged is not None else (None, None)
    if biases is not None:
        markers = biased(markers, model, messages, biases, seed)
    reply = build_choice(body, model, messages, markers, False, max_tokens)
    key = hashlib.sha256(json.dumps({**body, "model": model}, sort_keys=True,
                                    ensure_ascii=False).encode("utf-8")).hexdigest()
    return ChatRequest(body, model, messages, max_tokens, n, markers, reply, key,
                       count_prompt_tokens(messages))


def biased(markers: Markers, model: str, messages: list, biases: Any, seed: Any) -> Markers:
    """The markers a judge with ``biases`` answers by: a pairwise request's winner drawn from them,
    a rating moved by its leniency and noise (a marker in the request still decides)."""
    import dataclasses

    from evalq.sim.pairwise import rated, winner
    from evalq.sim.replies import request_digest
    from evalq.sim.tokens import message_text

    digest = request_digest(model, messages)
    last = next((message_text(m) for m in reversed(messages) if m.get("role") == "user"), "")
    pick = winner(last, digest, biases, seed) if "winner" not in markers.fields else None
    if pick is not None:
        return dataclasses.replace(markers, fields={**markers.fields, "winner": pick})
    if markers.score is not None and (biases.leniency or biases.noise):
        return dataclasses.replace(markers, score=rated(markers.score, digest, biases, seed))
    return markers


def estimated_tokens(body: Any, default_max_tokens: int) -> int:
    """A batch line's share of the enqueued-token count: its admission cost
    (:meth:`ChatRequest.cost`), read leniently from a body that may not be valid."""
    if not isinstance(body, dict):
        return 0
    messages = body.get("messages")
    prompt = count_prompt_tokens(messages) if isinstance(messages, list) else 0
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        max_tokens = default_max_tokens
    n = body.get("n")
    n = n if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 128 else 1
    return prompt + max_tokens * n


def error_body(message: str, etype: str, code: str | None = None, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": etype, "param": param, "code": code}}


def completion(request: ChatRequest, reply: tuple[dict, str, int]) -> dict:
    """The ``chat.completion`` object answering ``request`` with ``reply`` (n choices)."""
    message, finish, per_choice = reply
    completion_tokens = per_choice * request.n
    return {
        "id": "chatcmpl-sim" + uuid.uuid4().hex[:20],
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.model,
        "system_fingerprint": "judge-sim",
        "choices": [{"index": i, "message": message, "finish_reason": finish, "logprobs": None}
                    for i in range(request.n)],
        "usage": {"prompt_tokens": request.prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": request.prompt_tokens + completion_tokens},
    }
