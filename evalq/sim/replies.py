"""Reply content: deterministic from the model and the messages (score, reason,
plain text, JSON object, a value valid for a JSON Schema, tool calls)."""

from __future__ import annotations

import hashlib
import json

from evalq.shared.judging.schema_values import SchemaError, SchemaValues, hashed
from evalq.sim.faults import Markers, break_json
from evalq.sim.tokens import count_tokens, message_text as _message_text


_REASONS = {
    1: "The answer is wrong or unrelated to the question.",
    2: "The answer is mostly incorrect, with a few relevant points.",
    3: "The answer is partially correct but misses key details.",
    4: "The answer is correct with minor omissions.",
    5: "The answer is fully correct, complete and well supported.",
}
_REASON_TAILS = ("", " The wording is clear.", " It stays on topic.", " It is concise.")


def request_digest(model: str, messages: list) -> bytes:
    canon = json.dumps({"model": model, "messages": messages}, sort_keys=True,
                       ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canon.encode("utf-8")).digest()


def _reason(score: int, digest: bytes) -> str:
    base = _REASONS.get(score, "The score was set by the request.")
    return base + _REASON_TAILS[hashed(digest, "reason-tail") % len(_REASON_TAILS)]


def _truncate(text: str, max_tokens: int | None) -> tuple[str, bool]:
    if max_tokens is None or count_tokens(text) <= max_tokens:
        return text, False
    return text.encode("utf-8")[: 4 * max_tokens].decode("utf-8", "ignore"), True


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param, self.code = param, code


def build_choice(body: dict, model: str, messages: list, markers: Markers, malformed: bool,
                  max_tokens: int | None) -> tuple[dict, str, int]:
    """(message, finish_reason, completion_tokens) for one choice."""
    digest = request_digest(model, messages)
    score = markers.score if markers.score is not None else 1 + int.from_bytes(digest[:8], "big") % 5
    reason = _reason(score, digest)

    tools = [t for t in body.get("tools") or () if isinstance(t, dict) and t.get("type") == "function"
             and isinstance(t.get("function"), dict) and t["function"].get("name")]
    choice = body.get("tool_choice")
    if tools and choice != "none":
        fn = tools[0]["function"]
        if isinstance(choice, dict) and choice.get("type", "function") == "function":
            wanted = (choice.get("function") or {}).get("name")
            fn = next((t["function"] for t in tools if t["function"]["name"] == wanted), None)
            if fn is None:
                raise BadRequest(f"tool_choice names an unknown function {wanted!r}", "tool_choice")
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        try:
            args = json.dumps(SchemaValues(params, digest, score, reason, markers.fields, markers.plain).generate())
        except SchemaError as exc:
            raise BadRequest(f"cannot satisfy the parameters of {fn['name']!r}: {exc}", "tools") from None
        if malformed:
            args = break_json(args)
        args, cut = _truncate(args, max_tokens)
        call_id = "call_" + hashlib.sha256(digest + fn["name"].encode()).hexdigest()[:24]
        message = {"role": "assistant", "content": None, "refusal": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": fn["name"], "arguments": args}}]}
        return message, "length" if cut else "tool_calls", count_tokens(args)

    fmt = body.get("response_format")
    ftype = fmt.get("type") if isinstance(fmt, dict) else None
    if ftype == "json_schema":
        wanted = fmt.get("json_schema")
        if not isinstance(wanted, dict):
            raise BadRequest("Missing required parameter: 'response_format.json_schema'.",
                              "response_format.json_schema")
        schema = wanted.get("schema", {"type": "object", "properties": {
            "score": {"type": "integer"}, "reason": {"type": "string"}}, "required": ["score", "reason"]})
        try:
            content = json.dumps(SchemaValues(schema, digest, score, reason, markers.fields, markers.plain).generate(),
                                 ensure_ascii=False)
        except SchemaError as exc:
            raise BadRequest(f"cannot satisfy response_format schema: {exc}", "response_format") from None
    elif ftype == "json_object":
        if not any("json" in _message_text(m).lower() for m in messages):
            raise BadRequest("'messages' must contain the word 'json' in some form, to use "
                              "'response_format' of type 'json_object'.", "messages")
        content = json.dumps({"reason": reason, "winner": markers.fields["winner"]} if "winner" in markers.fields
                             else {"score": score, "reason": reason})
    elif ftype in (None, "text"):
        verdict = f"Winner: {markers.fields['winner']}" if "winner" in markers.fields else f"Score: {score}"
        content = markers.echo if markers.echo is not None else f"Reason: {reason}\n{verdict}"
    else:
        raise BadRequest(f"Invalid value for 'response_format.type': {ftype!r}", "response_format.type")
    if malformed:
        if ftype in ("json_schema", "json_object"):
            content = break_json(content)
        else:
            content = ("I looked at the answer carefully, but I cannot decide on a rating for "
                       "this one; it has some merits and some flaws.")
    content, cut = _truncate(content, max_tokens)
    message = {"role": "assistant", "content": content, "refusal": None}
    return message, "length" if cut else "stop", count_tokens(content)
