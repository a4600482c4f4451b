"""judge-sim: an OpenAI-compatible HTTP server that *simulates* LLM endpoints.

It is not a judge of quality. It exists so that evalq's judge layer can be tested,
demonstrated and capacity-planned against real HTTP with the real ``openai`` SDK,
with per-region rate limits, latency and faults, and without any network or model.

Standard library only (``http.server.ThreadingHTTPServer``): one server per
simulated region, each on its own loopback port and thread.

Endpoints (on every region's port)
----------------------------------
``POST /v1/chat/completions``                                    OpenAI
``POST /openai/deployments/{deployment}/chat/completions?api-version=...``  Azure OpenAI
``POST /openai/v1/chat/completions``                              Azure OpenAI "v1" API
``GET  /v1/models``                                               configured model names
``GET  /stats``  / ``POST /stats/reset[?limits=1]``                this region's counters

Rate limits
-----------
Each region admits at most ``rpm`` requests and ``tpm`` tokens per sliding window of
``window_seconds`` (60 by default: the window replaces the minute, so with a 5 s
window the budgets apply per 5 s). A limit of 0 (or None) is disabled. The
admission cost of a request, as Azure OpenAI counts it, is
``prompt_tokens + max_tokens * n`` where ``max_tokens`` is ``max_completion_tokens``
or ``max_tokens`` from the request, else ``default_max_tokens`` (256). A request
over a budget is answered 429 with ``Retry-After`` (whole seconds, at least 1) and
``retry-after-ms`` (the exact wait until the window has room) and an OpenAI-style
error body (``code: rate_limit_exceeded``, ``type: requests|tokens``); it consumes
nothing. A request whose cost exceeds ``tpm`` on its own can never be admitted: 429
with ``x-should-retry: false``. Successful replies carry
``x-ratelimit-{limit,remaining}-{requests,tokens}`` headers.

Token counting (deterministic; no tiktoken)
-------------------------------------------
``tokens(text) = ceil(len(text.encode("utf-8")) / 4)``.
``prompt_tokens = sum over messages of (4 + tokens(text of the message))`` where the
text of a message is its string content, or the concatenated ``text`` of its content
parts, followed by the ``arguments`` of any ``tool_calls`` it carries. Tool
definitions and response formats are not counted. ``completion_tokens`` is
``tokens(content)`` (for a tool call: ``tokens(arguments)``) summed over the ``n``
choices. If the request sets ``max_tokens``/``max_completion_tokens`` and the reply is
longer, it is cut to ``4 * max_tokens`` bytes with ``finish_reason: "length"``.

Replies
-------
Deterministic: a reply depends only on the model (for Azure: the deployment) and
the messages, via ``digest = sha256(model + messages)``; ``score = 1 + digest % 5``
and a one-line reason without digits. Formats:

* no ``response_format``/``tools``: ``"Reason: <reason>\\nScore: <score>"``;
* ``{"type": "json_object"}``: ``{"score": <score>, "reason": "<reason>"}`` (like the
  real API, some message must mention "json", else 400);
* ``{"type": "json_schema", "json_schema": {"schema": ...}}``: a JSON value valid for
  the schema (see :class:`_SchemaGen`; a property named ``score`` gets the score,
  clamped into its bounds);
* ``tools`` (unless ``tool_choice`` is ``"none"``): one ``tool_calls`` entry for the
  function named by ``tool_choice``, else the first function; its ``arguments`` are
  valid for the function's ``parameters``; ``finish_reason: "tool_calls"``.

Markers (anywhere in any message's text, except ``score=``)
-----------------------------------------------------------
``[[sim:score=N]]``     in the *last user message*: the score is the integer N
``[[sim:429]]``         answer 429 with ``Retry-After: 1`` (consumes no quota)
``[[sim:500]]``         answer 500 (after admission: the quota is consumed)
``[[sim:timeout]]``     hang ``Faults.timeout_seconds`` then drop the connection (or
                        answer late with ``timeout_action="late"``)
``[[sim:malformed]]``   200 whose content has no valid score: prose without digits
                        (plain), or truncated JSON (json modes, tool arguments)
``[[sim:KIND-once]]``   KIND in 500/429/timeout/malformed: the fault happens only the
                        first time the sim sees that exact request (same model and
                        body, any region; for 500/timeout/malformed: the first time
                        it is admitted), so a retry succeeds
``[[sim:delay=S]]``     add S seconds of latency to this request
If several fault markers are present: 429, then 500, timeout, malformed.

Latency: every admitted request waits ``latency + U[0, jitter)`` (plus any
``delay=`` marker) before it is answered, 500s included. Random faults (``Faults``)
and the jitter come from a per-region ``random.Random`` seeded from ``seed`` and the
region name, two draws per admitted request in admission order, so a serial client
sees the same sequence on every run.

Stats (``GET /stats`` on a region's port, ``JudgeSim.stats()``) count chat-completion
requests only: ``requests``, ``ok``, ``rate_limited`` (429s, of which
``rate_limited_injected`` by marker), ``errors`` (``error500``, ``timeout``,
``malformed``, ``total``), ``unauthorized``, ``bad_request``, ``prompt_tokens`` and
``completion_tokens`` (of the replies sent), ``admitted_requests``/``admitted_tokens``
(admission costs), ``window_requests``/``window_tokens`` (now in the window),
``peak_window_requests``/``peak_window_tokens``, ``in_flight``/``peak_in_flight``.
Once nothing is in flight, ``requests`` is the sum of ok, rate_limited,
errors.total, unauthorized and bad_request. ``POST /stats/reset`` zeroes them;
``?limits=1`` also empties the rate-limit window and forgets ``-once`` requests.

Authentication: a key must be sent (``Authorization: Bearer ...`` or ``api-key``);
any key is accepted unless the sim was given ``api_key``, then others get 401
(``/stats`` needs no key). The key is never logged.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import math
import random
import re
import signal
import socket
import socketserver
import sys
import threading
import time
import traceback
import uuid
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterable, Sequence, TextIO
from urllib.parse import parse_qs, urlsplit

import click

HOST = "127.0.0.1"
DEFAULT_MODEL = "judge-sim"
DEFAULT_MAX_TOKENS = 256
INJECTED_RETRY_AFTER_S = 1

__all__ = [
    "Faults", "JudgeSim", "Region", "count_prompt_tokens", "count_tokens",
    "judge_sim_command", "main", "parse_region",
]


# ---------------------------------------------------------------- configuration

@dataclass(frozen=True)
class Region:
    """A simulated region: its own port, RPM and TPM budgets. ``port=0`` picks a free
    port; a limit of 0 or None disables that limit."""

    name: str
    tpm: int | None = None
    rpm: int | None = None
    port: int = 0

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError("region name must be a non-empty string")
        for label, value in (("tpm", self.tpm), ("rpm", self.rpm)):
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"region {self.name}: {label} must be a non-negative integer")
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"region {self.name}: bad port {self.port!r}")


@dataclass(frozen=True)
class Faults:
    """Seeded random fault rates (probabilities per admitted request, summing to at
    most 1). A timeout hangs ``timeout_seconds``, then drops the connection
    (``timeout_action="drop"``) or sends the normal reply late (``"late"``)."""

    error500: float = 0.0
    timeout: float = 0.0
    malformed: float = 0.0
    timeout_seconds: float = 30.0
    timeout_action: str = "drop"

    def __post_init__(self) -> None:
        rates = (self.error500, self.timeout, self.malformed)
        if any(not 0.0 <= r <= 1.0 for r in rates) or sum(rates) > 1.0 + 1e-9:
            raise ValueError("fault rates must be in [0, 1] and sum to at most 1")
        if self.timeout_seconds < 0:
            raise ValueError("timeout_seconds must be >= 0")
        if self.timeout_action not in ("drop", "late"):
            raise ValueError("timeout_action must be 'drop' or 'late'")


def parse_region(spec: str) -> Region:
    """``NAME:TPM:RPM[:PORT]`` -> Region (0 disables a limit; no port: a free one)."""
    parts = spec.split(":")
    if len(parts) not in (3, 4) or not parts[0]:
        raise ValueError(f"region {spec!r}: expected NAME:TPM:RPM[:PORT]")
    try:
        nums = [int(p) for p in parts[1:]]
    except ValueError:
        raise ValueError(f"region {spec!r}: expected NAME:TPM:RPM[:PORT] with integer TPM, RPM, PORT") from None
    return Region(parts[0], tpm=nums[0], rpm=nums[1], port=nums[2] if len(nums) == 3 else 0)


# ---------------------------------------------------------------- token counting

def count_tokens(text: str) -> int:
    """ceil(utf-8 bytes / 4)."""
    return (len(text.encode("utf-8")) + 3) // 4


def _message_text(message: Any) -> str:
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = "".join(p.get("text", "") for p in content
                       if isinstance(p, dict) and isinstance(p.get("text", ""), str))
    else:
        text = ""
    for call in message.get("tool_calls") or ():
        if isinstance(call, dict) and isinstance(call.get("function"), dict):
            args = call["function"].get("arguments")
            if isinstance(args, str):
                text += args
    return text


def count_prompt_tokens(messages: Iterable[Any]) -> int:
    """sum over messages of 4 + count_tokens(message text)."""
    return sum(4 + count_tokens(_message_text(m)) for m in messages)


# ---------------------------------------------------------------- markers

_MARKER = re.compile(r"\[\[sim:([^\]\s]+)\]\]")
_FAULT_KINDS = ("429", "500", "timeout", "malformed")


@dataclass
class _Markers:
    faults: dict[str, bool] = field(default_factory=dict)  # kind -> once?
    delay: float = 0.0
    score: int | None = None


def _parse_markers(messages: list) -> _Markers:
    found = _Markers()
    for msg in messages:
        for token in _MARKER.findall(_message_text(msg)):
            token = token.lower()
            kind, once = (token[:-5], True) if token.endswith("-once") else (token, False)
            if kind in _FAULT_KINDS:
                # a plain marker wins over the -once form of the same kind
                found.faults[kind] = found.faults.get(kind, True) and once
            elif token.startswith("delay="):
                with contextlib.suppress(ValueError):
                    found.delay += max(0.0, float(token[6:]))
    for msg in reversed(messages):
        if isinstance(msg, dict) and msg.get("role") == "user":
            scores = re.findall(r"\[\[sim:score=(-?\d+)\]\]", _message_text(msg))
            if scores:
                found.score = int(scores[-1])
            break
    return found


# ---------------------------------------------------------------- reply content

_REASONS = {
    1: "The answer is wrong or unrelated to the question.",
    2: "The answer is mostly incorrect, with a few relevant points.",
    3: "The answer is partially correct but misses key details.",
    4: "The answer is correct with minor omissions.",
    5: "The answer is fully correct, complete and well supported.",
}
_REASON_TAILS = ("", " The wording is clear.", " It stays on topic.", " It is concise.")


def _digest(model: str, messages: list) -> bytes:
    canon = json.dumps({"model": model, "messages": messages}, sort_keys=True,
                       ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canon.encode("utf-8")).digest()


def _sub(digest: bytes, path: str) -> int:
    return int.from_bytes(hashlib.sha256(digest + path.encode("utf-8")).digest()[:8], "big")


def _reason(score: int, digest: bytes) -> str:
    base = _REASONS.get(score, "The score was set by the request.")
    return base + _REASON_TAILS[_sub(digest, "reason-tail") % len(_REASON_TAILS)]


class _SchemaError(ValueError):
    pass


class _SchemaGen:
    """Builds a JSON value valid for a JSON Schema, deterministically.

    Supported: type (or a list of types), const, enum, properties/required (all
    declared properties are produced, plus required ones not declared), local $ref
    (``#``, ``#/$defs/...``, ``#/definitions/...``), allOf (merged), anyOf/oneOf
    (first non-null option), integer/number bounds (minimum, maximum, exclusive
    forms, integer multipleOf), string minLength/maxLength/format (date-time, date,
    time, email, uri, uuid), array minItems/items/prefixItems (minimal: minItems
    elements). Not supported: pattern, uniqueItems with several items, contains,
    if/then/else, dependent*, minProperties.

    A property named ``score`` gets the score (clamped into its bounds; for an enum,
    the score if listed, else a member); other strings get the reason; booleans are
    ``score >= 3``; other integers/numbers are picked inside their bounds."""

    MAX_DEPTH = 32

    def __init__(self, root: Any, digest: bytes, score: int, reason: str) -> None:
        self.root, self.digest, self.score, self.reason = root, digest, score, reason

    def generate(self) -> Any:
        return self.value(self.root, "$", None, 0)

    def _resolve(self, schema: Any, depth: int) -> Any:
        seen = 0
        while isinstance(schema, dict) and isinstance(schema.get("$ref"), str):
            seen += 1
            if seen > self.MAX_DEPTH:
                raise _SchemaError("$ref cycle")
            ref = schema["$ref"]
            if not ref.startswith("#"):
                target: Any = {}
            else:
                target = self.root
                for part in [p for p in ref[1:].split("/") if p]:
                    part = part.replace("~1", "/").replace("~0", "~")
                    if not isinstance(target, dict) or part not in target:
                        raise _SchemaError(f"unresolvable $ref {ref!r}")
                    target = target[part]
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            schema = {**target, **rest} if isinstance(target, dict) else target
        return schema

    def _merge_all_of(self, schema: dict, depth: int) -> dict:
        merged = {k: v for k, v in schema.items() if k != "allOf"}
        for sub in schema["allOf"]:
            sub = self._resolve(sub, depth)
            if isinstance(sub, dict) and "allOf" in sub:
                sub = self._merge_all_of(sub, depth)
            if not isinstance(sub, dict):
                continue
            for key, val in sub.items():
                if key == "properties" and isinstance(val, dict):
                    merged["properties"] = {**merged.get("properties", {}), **val}
                elif key == "required" and isinstance(val, list):
                    merged["required"] = list(merged.get("required", [])) + val
                else:
                    merged.setdefault(key, val)
        return merged

    def value(self, schema: Any, path: str, name: str | None, depth: int) -> Any:
        if depth > self.MAX_DEPTH:
            raise _SchemaError("schema too deep")
        schema = self._resolve(schema, depth)
        if schema is True or schema is None:
            schema = {}
        if schema is False:
            raise _SchemaError(f"no value satisfies the schema at {path}")
        if not isinstance(schema, dict):
            raise _SchemaError(f"bad schema at {path}")
        if "allOf" in schema:
            schema = self._merge_all_of(schema, depth)
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list) and schema[key]:
                options = [self._resolve(o, depth) for o in schema[key]]
                pick = next((o for o in options if not _is_null_schema(o)), options[0])
                base = {k: v for k, v in schema.items() if k not in ("anyOf", "oneOf")}
                merged = {**base, **pick} if isinstance(pick, dict) else pick
                return self.value(merged, path, name, depth + 1)
        is_score = (name or "").lower() == "score"
        h = _sub(self.digest, path)
        if "const" in schema:
            return schema["const"]
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            enum = schema["enum"]
            if is_score:
                for candidate in (self.score, str(self.score)):
                    if candidate in enum:
                        return candidate
            return enum[h % len(enum)]
        stype = _schema_type(schema)
        if stype == "null":
            return None
        if stype == "boolean":
            return self.score >= 3
        if stype == "integer":
            return self._integer(schema, is_score, h)
        if stype == "number":
            return self._number(schema, is_score, h)
        if stype == "array":
            return self._array(schema, path, depth)
        if stype == "object":
            return self._object(schema, path, depth)
        if stype == "string":
            return self._string(schema, is_score, h)
        return self.score if is_score else self.reason  # {}: anything goes

    def _integer(self, schema: dict, is_score: bool, h: int) -> int:
        lo, hi = _int_bounds(schema)
        if not is_score and lo is not None and hi is not None and hi >= lo:
            value = lo + h % (hi - lo + 1)
        else:
            value = self.score
            if lo is not None:
                value = max(value, lo)
            if hi is not None:
                value = min(value, hi)
        return int(_multiple_of(value, schema.get("multipleOf"), lo, False, hi, False, True))

    def _number(self, schema: dict, is_score: bool, h: int) -> float:
        lo, lo_ex = _bound(schema, "minimum", "exclusiveMinimum")
        hi, hi_ex = _bound(schema, "maximum", "exclusiveMaximum")
        if not is_score and lo is not None and hi is not None:
            candidate = round(lo + (h % 997 + 1) / 999 * (hi - lo), 3)
        else:
            candidate = float(self.score)
        value = _clamp_number(candidate, lo, lo_ex, hi, hi_ex)
        return _multiple_of(value, schema.get("multipleOf"), lo, lo_ex, hi, hi_ex, False)

    def _string(self, schema: dict, is_score: bool, h: int) -> str:
        formats = {
            "date-time": "2024-01-01T00:00:00Z", "date": "2024-01-01", "time": "00:00:00Z",
            "email": "judge@example.com", "uri": "https://example.com/judge-sim",
            "url": "https://example.com/judge-sim",
            "uuid": str(uuid.UUID(int=h << 64 | h, version=4)),
        }
        fmt = schema.get("format")
        if fmt in formats:
            return formats[fmt]
        text = str(self.score) if is_score else self.reason
        min_len, max_len = schema.get("minLength"), schema.get("maxLength")
        if isinstance(max_len, int) and len(text) > max_len:
            text = text[:max_len]
        if isinstance(min_len, int) and len(text) < min_len:
            text = text + "." * (min_len - len(text))
        return text

    def _array(self, schema: dict, path: str, depth: int) -> list:
        count = schema.get("minItems", 0)
        count = count if isinstance(count, int) and count > 0 else 0
        prefix = schema.get("prefixItems") if isinstance(schema.get("prefixItems"), list) else []
        items = schema.get("items", {})
        if isinstance(items, list):  # draft-04 tuple form
            prefix, items = items, schema.get("additionalItems", {})
        out = []
        for i in range(count):
            sub = prefix[i] if i < len(prefix) else items
            out.append(self.value(sub, f"{path}[{i}]", None, depth + 1))
        return out

    def _object(self, schema: dict, path: str, depth: int) -> dict:
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        required = [r for r in schema.get("required", []) if isinstance(r, str)]
        out: dict[str, Any] = {}
        for key, sub in props.items():
            if sub is False or (key not in required and depth > 4):
                continue
            out[key] = self.value(sub, f"{path}.{key}", key, depth + 1)
        extra = schema.get("additionalProperties", {})
        for key in required:
            if key not in out:
                out[key] = self.value(extra if isinstance(extra, dict) else {},
                                      f"{path}.{key}", key, depth + 1)
        return out


def _is_null_schema(schema: Any) -> bool:
    return isinstance(schema, dict) and (schema.get("type") == "null" or schema.get("type") == ["null"])


def _schema_type(schema: dict) -> str | None:
    stype = schema.get("type")
    if isinstance(stype, list):
        non_null = [t for t in stype if t != "null"]
        stype = non_null[0] if non_null else ("null" if stype else None)
    if isinstance(stype, str):
        return stype
    if any(k in schema for k in ("properties", "required", "additionalProperties")):
        return "object"
    if any(k in schema for k in ("items", "prefixItems", "minItems")):
        return "array"
    if any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")):
        return "number"
    if any(k in schema for k in ("minLength", "maxLength", "format", "pattern")):
        return "string"
    return None


def _bound(schema: dict, inclusive: str, exclusive: str) -> tuple[float | None, bool]:
    ex = schema.get(exclusive)
    val = schema.get(inclusive)
    if isinstance(ex, bool):  # draft-04: boolean flag on minimum/maximum
        return (val, ex) if isinstance(val, (int, float)) else (None, False)
    if isinstance(ex, (int, float)):
        if isinstance(val, (int, float)) and val != ex:
            # both given: the tighter one applies
            tighter_ex = ex >= val if inclusive == "minimum" else ex <= val
            return (ex, True) if tighter_ex else (val, False)
        return ex, True
    return (val, False) if isinstance(val, (int, float)) and not isinstance(val, bool) else (None, False)


def _int_bounds(schema: dict) -> tuple[int | None, int | None]:
    lo, lo_ex = _bound(schema, "minimum", "exclusiveMinimum")
    hi, hi_ex = _bound(schema, "maximum", "exclusiveMaximum")
    if lo is not None:
        lo = math.floor(lo) + 1 if lo_ex else math.ceil(lo)
    if hi is not None:
        hi = math.ceil(hi) - 1 if hi_ex else math.floor(hi)
    return lo, hi


def _clamp_number(v: float, lo: float | None, lo_ex: bool, hi: float | None, hi_ex: bool) -> float:
    def ok(x: float) -> bool:
        return ((lo is None or (x > lo if lo_ex else x >= lo))
                and (hi is None or (x < hi if hi_ex else x <= hi)))
    if ok(v):
        return v
    below = lo is not None and (v < lo or (lo_ex and v <= lo))
    edge = lo if below else hi
    if edge is not None and ok(float(edge)):
        return float(edge)
    if lo is not None and hi is not None:
        return (lo + hi) / 2
    if lo is not None:
        return float(lo) + 1.0
    return float(hi) - 1.0  # type: ignore[arg-type]


def _multiple_of(value: float, mult: Any, lo: float | None, lo_ex: bool, hi: float | None,
                 hi_ex: bool, integer: bool) -> float:
    """A multiple of ``mult`` inside the bounds, near ``value`` (best effort for floats)."""
    if not isinstance(mult, (int, float)) or isinstance(mult, bool) or mult <= 0:
        return value

    def ok(x: float) -> bool:
        return ((lo is None or (x > lo if lo_ex else x >= lo))
                and (hi is None or (x < hi if hi_ex else x <= hi)))

    ks = [round(value / mult)]
    if lo is not None:
        ks += [math.ceil(lo / mult) + i for i in range(3)]
    if hi is not None:
        ks += [math.floor(hi / mult) - i for i in range(3)]
    for k in ks:
        for x in (k * mult, round(k * mult, 12)):
            if integer:
                if float(x) != int(x):
                    continue
                x = int(x)
            if ok(x) and float(x / mult).is_integer():
                return x
    return value


def _break_json(text: str) -> str:
    """Cut JSON text in half so that it no longer parses."""
    cut = text[: len(text) // 2]
    try:
        json.loads(cut)
    except ValueError:
        return cut
    return '{"score": '


def _truncate(text: str, max_tokens: int | None) -> tuple[str, bool]:
    if max_tokens is None or count_tokens(text) <= max_tokens:
        return text, False
    return text.encode("utf-8")[: 4 * max_tokens].decode("utf-8", "ignore"), True


class _BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param, self.code = param, code


def _build_choice(body: dict, model: str, messages: list, markers: _Markers, malformed: bool,
                  max_tokens: int | None) -> tuple[dict, str, int]:
    """(message, finish_reason, completion_tokens) for one choice."""
    digest = _digest(model, messages)
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
                raise _BadRequest(f"tool_choice names an unknown function {wanted!r}", "tool_choice")
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        try:
            args = json.dumps(_SchemaGen(params, digest, score, reason).generate())
        except _SchemaError as exc:
            raise _BadRequest(f"cannot satisfy the parameters of {fn['name']!r}: {exc}", "tools") from None
        if malformed:
            args = _break_json(args)
        args, cut = _truncate(args, max_tokens)
        call_id = "call_" + hashlib.sha256(digest + fn["name"].encode()).hexdigest()[:24]
        message = {"role": "assistant", "content": None, "refusal": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": fn["name"], "arguments": args}}]}
        return message, "length" if cut else "tool_calls", count_tokens(args)

    fmt = body.get("response_format")
    ftype = fmt.get("type") if isinstance(fmt, dict) else None
    if ftype == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise _BadRequest("Missing required parameter: 'response_format.json_schema'.",
                              "response_format.json_schema")
        schema = spec.get("schema", {"type": "object", "properties": {
            "score": {"type": "integer"}, "reason": {"type": "string"}}, "required": ["score", "reason"]})
        try:
            content = json.dumps(_SchemaGen(schema, digest, score, reason).generate(), ensure_ascii=False)
        except _SchemaError as exc:
            raise _BadRequest(f"cannot satisfy response_format schema: {exc}", "response_format") from None
    elif ftype == "json_object":
        if not any("json" in _message_text(m).lower() for m in messages):
            raise _BadRequest("'messages' must contain the word 'json' in some form, to use "
                              "'response_format' of type 'json_object'.", "messages")
        content = json.dumps({"score": score, "reason": reason})
    elif ftype in (None, "text"):
        content = f"Reason: {reason}\nScore: {score}"
    else:
        raise _BadRequest(f"Invalid value for 'response_format.type': {ftype!r}", "response_format.type")
    if malformed:
        if ftype in ("json_schema", "json_object"):
            content = _break_json(content)
        else:
            content = ("I looked at the answer carefully, but I cannot decide on a rating for "
                       "this one; it has some merits and some flaws.")
    content, cut = _truncate(content, max_tokens)
    message = {"role": "assistant", "content": content, "refusal": None}
    return message, "length" if cut else "stop", count_tokens(content)


# ---------------------------------------------------------------- per-region state

_COUNTERS = ("requests", "ok", "rate_limited", "rate_limited_injected", "unauthorized",
             "bad_request", "error500", "timeout", "malformed", "prompt_tokens",
             "completion_tokens", "admitted_requests", "admitted_tokens",
             "peak_window_requests", "peak_window_tokens", "peak_in_flight")


@dataclass
class _Admission:
    admitted: bool
    kind: str = ""            # "requests" | "tokens" when refused
    wait: float = 0.0         # seconds until it would fit
    too_large: bool = False
    remaining_requests: int | None = None
    remaining_tokens: int | None = None
    fault_draw: float = 0.0
    jitter_draw: float = 0.0


class _RegionState:
    def __init__(self, region: Region, window: float, seed: int) -> None:
        self.region = region
        self.window = window
        self.lock = threading.Lock()
        self.rng = random.Random(f"{seed}:{region.name}")
        self.entries: deque[tuple[float, int]] = deque()  # (admitted at, cost)
        self.window_tokens = 0
        self.in_flight = 0
        self.counts = dict.fromkeys(_COUNTERS, 0)

    def _prune(self, now: float) -> None:
        while self.entries and self.entries[0][0] <= now - self.window:
            _, cost = self.entries.popleft()
            self.window_tokens -= cost

    def admit(self, cost: int) -> _Admission:
        rpm, tpm = self.region.rpm or None, self.region.tpm or None
        with self.lock:
            now = time.monotonic()
            self._prune(now)
            if tpm is not None and cost > tpm:
                return _Admission(False, "tokens", self.window, too_large=True)
            n, tokens = len(self.entries), self.window_tokens
            fits_r = rpm is None or n + 1 <= rpm
            fits_t = tpm is None or tokens + cost <= tpm
            if not (fits_r and fits_t):
                kind = "requests" if not fits_r else "tokens"
                wait = self.window
                for at, c in self.entries:  # oldest first: when has enough expired?
                    n, tokens = n - 1, tokens - c
                    if (rpm is None or n + 1 <= rpm) and (tpm is None or tokens + cost <= tpm):
                        wait = at + self.window - now
                        break
                return _Admission(False, kind, max(wait, 0.001))
            self.entries.append((now, cost))
            self.window_tokens += cost
            c = self.counts
            c["admitted_requests"] += 1
            c["admitted_tokens"] += cost
            c["peak_window_requests"] = max(c["peak_window_requests"], len(self.entries))
            c["peak_window_tokens"] = max(c["peak_window_tokens"], self.window_tokens)
            return _Admission(
                True,
                remaining_requests=None if rpm is None else rpm - len(self.entries),
                remaining_tokens=None if tpm is None else tpm - self.window_tokens,
                fault_draw=self.rng.random(), jitter_draw=self.rng.random())

    def add(self, **deltas: int) -> None:
        with self.lock:
            for key, delta in deltas.items():
                self.counts[key] += delta

    def enter(self) -> None:
        with self.lock:
            self.counts["requests"] += 1
            self.in_flight += 1
            self.counts["peak_in_flight"] = max(self.counts["peak_in_flight"], self.in_flight)

    def leave(self) -> None:
        with self.lock:
            self.in_flight -= 1

    def snapshot(self, port: int) -> dict:
        with self.lock:
            self._prune(time.monotonic())
            c = dict(self.counts)
            errors = {"error500": c.pop("error500"), "timeout": c.pop("timeout"),
                      "malformed": c.pop("malformed")}
            errors["total"] = sum(errors.values())
            return {
                "region": self.region.name, "port": port, "tpm": self.region.tpm or None,
                "rpm": self.region.rpm or None, "window_seconds": self.window,
                **{k: c[k] for k in ("requests", "ok", "rate_limited", "rate_limited_injected")},
                "errors": errors,
                **{k: c[k] for k in ("unauthorized", "bad_request", "prompt_tokens",
                                     "completion_tokens", "admitted_requests", "admitted_tokens")},
                "window_requests": len(self.entries), "window_tokens": self.window_tokens,
                "peak_window_requests": c["peak_window_requests"],
                "peak_window_tokens": c["peak_window_tokens"],
                "in_flight": self.in_flight, "peak_in_flight": c["peak_in_flight"],
            }

    def reset(self, clear_limits: bool) -> None:
        with self.lock:
            self.counts = dict.fromkeys(_COUNTERS, 0)
            self.counts["peak_in_flight"] = self.in_flight
            if clear_limits:
                self.entries.clear()
                self.window_tokens = 0
            else:
                self.counts["peak_window_requests"] = len(self.entries)
                self.counts["peak_window_tokens"] = self.window_tokens


# ---------------------------------------------------------------- HTTP

_AZURE_PATH = re.compile(r"^/openai/deployments/([^/]+)/chat/completions$")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    allow_reuse_address = True

    def __init__(self, sim: JudgeSim, state: _RegionState) -> None:
        self.sim, self.state = sim, state
        self.conns: set[socket.socket] = set()
        self.handler_threads: set[threading.Thread] = set()
        self.conn_lock = threading.Lock()
        super().__init__((HOST, state.region.port), _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind would call socket.getfqdn(): a DNS lookup, needless here
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = HOST, self.server_address[1]

    def process_request_thread(self, request, client_address):  # noqa: ANN001
        me = threading.current_thread()
        with self.conn_lock:
            self.conns.add(request)
            self.handler_threads.add(me)
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.conn_lock:
                self.conns.discard(request)
                self.handler_threads.discard(me)

    def handle_error(self, request, client_address) -> None:  # noqa: ANN001
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):  # a client went away, or stop() closed the socket
            return
        super().handle_error(request, client_address)

    def close_connections(self) -> None:
        with self.conn_lock:
            conns = list(self.conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def join_handlers(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.conn_lock:
            threads = list(self.handler_threads)
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))


class _Drop(Exception):
    """Close the connection without answering."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "judge-sim"
    sys_version = ""
    timeout = 120  # idle keep-alive connections are closed after this
    disable_nagle_algorithm = True  # else headers then body cost a 40 ms delayed-ACK stall
    server: _Server

    # -- plumbing
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # never the default (it would write to stderr); see _log

    def _log(self, status: int | str) -> None:
        stream = self.server.sim.log
        if stream is None:
            return
        path = urlsplit(self.path).path  # no query string, no headers: never a key
        with contextlib.suppress(Exception):
            stream.write(f"judge-sim {self.server.state.region.name} {self.command} {path} {status}\n")
            stream.flush()

    def _send_json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(obj, ensure_ascii=False).encode("utf-8")
        self._responded = True
        self._leave()  # before the reply goes out: a client's next /stats must not see this one in flight
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-request-id", uuid.uuid4().hex)
        self.send_header("x-judge-sim-region", self.server.state.region.name)
        for key, val in (headers or {}).items():
            self.send_header(key, val)
        self.end_headers()
        self.wfile.write(data)
        self._log(status)

    def _error(self, status: int, message: str, etype: str, code: str | None = None,
               param: str | None = None, headers: dict[str, str] | None = None) -> None:
        self._send_json(status, {"error": {"message": message, "type": etype, "param": param,
                                           "code": code}}, headers)

    def _read_body(self) -> bytes | None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            self.close_connection = True
            return None
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self.close_connection = True
            return None
        return self.rfile.read(length) if length > 0 else b""

    def _sleep(self, seconds: float) -> None:
        if seconds > 0 and self.server.sim._stopping.wait(seconds):
            raise _Drop()

    def _presented_key(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        if auth[:7].lower() == "bearer " and auth[7:].strip():
            return auth[7:].strip()
        key = self.headers.get("api-key", "").strip()
        return key or None

    def _authorized(self) -> bool:
        key = self._presented_key()
        expected = self.server.sim.api_key
        if key is None:
            return False
        return expected is None or hmac.compare_digest(key.encode(), expected.encode())

    def _unauthorized(self) -> None:
        self._error(401, "Incorrect API key provided (judge-sim).", "invalid_request_error",
                    "invalid_api_key")

    # -- routes
    def do_GET(self) -> None:  # noqa: N802
        path = urlsplit(self.path).path.rstrip("/")
        if path == "/stats":
            self._send_json(200, self.server.sim.stats(self.server.state.region.name))
        elif path in ("/v1/models", "/openai/models", "/openai/v1/models"):
            if not self._authorized():
                return self._unauthorized()
            self._send_json(200, {"object": "list", "data": [
                {"id": m, "object": "model", "created": 0, "owned_by": "judge-sim"}
                for m in self.server.sim.models]})
        else:
            self._error(404, f"Unknown path {path!r}", "invalid_request_error", "not_found")

    def do_POST(self) -> None:  # noqa: N802
        body = self._read_body()
        split = urlsplit(self.path)
        path = split.path.rstrip("/")
        if body is None:
            return self._error(400, "a Content-Length body is required", "invalid_request_error")
        if path == "/stats/reset":
            flag = parse_qs(split.query).get("limits", ["0"])[-1].lower()
            self.server.sim.reset_stats(self.server.state.region.name,
                                        clear_limits=flag in ("1", "true", "yes"))
            return self._send_json(200, self.server.sim.stats(self.server.state.region.name))
        azure = _AZURE_PATH.match(path)
        if azure is None and path not in ("/v1/chat/completions", "/openai/v1/chat/completions"):
            return self._error(404, f"Unknown path {path!r}", "invalid_request_error", "not_found")
        state = self.server.state
        state.enter()
        self._responded = False
        self._in_flight = True
        try:
            self._chat(body, azure.group(1) if azure else None, parse_qs(split.query))
        except _Drop:
            self.close_connection = True
            self._log("dropped")
        except OSError:
            self.close_connection = True
        except Exception:  # a judge-sim bug: say so rather than hang up
            self.close_connection = True
            traceback.print_exc()
            if not self._responded:
                with contextlib.suppress(OSError):
                    self._error(500, "judge-sim internal error (see its stderr)", "server_error")
        finally:
            self._leave()

    def _leave(self) -> None:
        if getattr(self, "_in_flight", False):
            self._in_flight = False
            self.server.state.leave()

    def _chat(self, raw: bytes, deployment: str | None, query: dict) -> None:
        sim, state = self.server.sim, self.server.state
        if not self._authorized():
            state.add(unauthorized=1)
            return self._unauthorized()

        def bad(message: str, param: str | None = None, code: str | None = None) -> None:
            state.add(bad_request=1)
            self._error(400, message, "invalid_request_error", code, param)

        if deployment is not None and not query.get("api-version"):
            return bad("Missing required query parameter 'api-version'.", "api-version")
        try:
            body = json.loads(raw or b"null")
        except (ValueError, UnicodeDecodeError):
            return bad("We could not parse the JSON body of your request.")
        if not isinstance(body, dict):
            return bad("The request body must be a JSON object.")
        model = deployment or body.get("model")
        if not isinstance(model, str) or not model:
            return bad("you must provide a model parameter", "model")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            return bad("'messages' must be a non-empty array of objects with a 'role'.", "messages")
        if body.get("stream"):
            return bad("judge-sim does not support stream=true.", "stream")
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
                                       or max_tokens < 1):
            return bad("max_tokens must be a positive integer.", "max_tokens")
        n = body.get("n", 1)
        if n is None:
            n = 1
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 128:
            return bad("n must be an integer between 1 and 128.", "n")

        markers = _parse_markers(messages)
        try:  # a pure function of the request: invalid requests are refused before admission
            reply = _build_choice(body, model, messages, markers, False, max_tokens)
        except _BadRequest as exc:
            return bad(str(exc), exc.param, exc.code)
        # "-once" faults fire the first time the sim sees this exact request
        req_key = hashlib.sha256(json.dumps({**body, "model": model}, sort_keys=True,
                                            ensure_ascii=False).encode("utf-8")).hexdigest()

        def fires(kind: str) -> bool:
            return kind in markers.faults and (
                not markers.faults[kind] or sim._first_time(f"{kind}:{req_key}"))

        if fires("429"):
            state.add(rate_limited=1, rate_limited_injected=1)
            return self._error(
                429, f"Rate limit reached (judge-sim injected). Please retry after "
                     f"{INJECTED_RETRY_AFTER_S} second.", "requests", "rate_limit_exceeded",
                headers={"Retry-After": str(INJECTED_RETRY_AFTER_S),
                         "retry-after-ms": str(INJECTED_RETRY_AFTER_S * 1000)})

        prompt_tokens = count_prompt_tokens(messages)
        cost = prompt_tokens + (max_tokens or sim.default_max_tokens) * n
        adm = state.admit(cost)
        if not adm.admitted:
            state.add(rate_limited=1)
            region = state.region
            headers = {"Retry-After": str(max(1, math.ceil(adm.wait))),
                       "retry-after-ms": str(max(1, math.ceil(adm.wait * 1000)))}
            if adm.too_large:
                headers["x-should-retry"] = "false"
                msg = (f"Request too large for region {region.name}: limit {region.tpm} tokens per "
                       f"{sim.window_seconds:g} s, requested {cost}.")
            elif adm.kind == "requests":
                msg = (f"Rate limit reached for requests in region {region.name}: limit {region.rpm} "
                       f"per {sim.window_seconds:g} s. Please retry after {headers['Retry-After']} "
                       f"seconds.")
            else:
                msg = (f"Rate limit reached for tokens in region {region.name}: limit {region.tpm} "
                       f"per {sim.window_seconds:g} s, requested {cost}. Please retry after "
                       f"{headers['Retry-After']} seconds.")
            return self._error(429, msg, adm.kind, "rate_limit_exceeded", headers=headers)

        faults = sim.faults
        fault = None
        for kind in ("500", "timeout", "malformed"):
            if fires(kind):
                fault = kind
                break
        if fault is None:
            u = adm.fault_draw
            if u < faults.error500:
                fault = "500"
            elif u < faults.error500 + faults.timeout:
                fault = "timeout"
            elif u < faults.error500 + faults.timeout + faults.malformed:
                fault = "malformed"
        delay = sim.latency + sim.jitter * adm.jitter_draw + markers.delay

        if fault == "500":
            state.add(error500=1)
            self._sleep(delay)
            return self._error(500, "The server had an error while processing your request. "
                                    "Sorry about that! (judge-sim injected)", "server_error")
        if fault == "malformed":
            reply = _build_choice(body, model, messages, markers, True, max_tokens)
        if fault == "timeout":
            state.add(timeout=1)
            self._sleep(faults.timeout_seconds)
            if faults.timeout_action == "drop":
                raise _Drop()
        else:
            self._sleep(delay)
            state.add(**({"malformed": 1} if fault == "malformed" else {"ok": 1}))
        message, finish, per_choice = reply
        choices = [(i, message, finish) for i in range(n)]
        completion_tokens = per_choice * n
        state.add(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
        headers = {}
        region = state.region
        if adm.remaining_requests is not None:
            headers["x-ratelimit-limit-requests"] = str(region.rpm)
            headers["x-ratelimit-remaining-requests"] = str(adm.remaining_requests)
        if adm.remaining_tokens is not None:
            headers["x-ratelimit-limit-tokens"] = str(region.tpm)
            headers["x-ratelimit-remaining-tokens"] = str(adm.remaining_tokens)
        self._send_json(200, {
            "id": "chatcmpl-sim" + uuid.uuid4().hex[:20],
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": "judge-sim",
            "choices": [{"index": i, "message": m, "finish_reason": f, "logprobs": None}
                        for i, m, f in choices],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        }, headers)


# ---------------------------------------------------------------- public API

class JudgeSim:
    """Simulated LLM regions on loopback. ``start()`` (or ``with``) binds one port per
    region; ``stop()`` shuts everything down, waking any request still sleeping."""

    def __init__(self, regions: Sequence[Region] | None = None, *, latency: float = 0.0,
                 jitter: float = 0.0, fault_rates: Faults | None = None,
                 window_seconds: float = 60.0, seed: int = 0, api_key: str | None = None,
                 models: Sequence[str] = (DEFAULT_MODEL,),
                 default_max_tokens: int = DEFAULT_MAX_TOKENS, log: TextIO | None = None) -> None:
        regions = list(regions) if regions else [Region("local")]
        names = [r.name for r in regions]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate region names: {names}")
        if latency < 0 or jitter < 0:
            raise ValueError("latency and jitter must be >= 0")
        if window_seconds <= 0:
            raise ValueError("window_seconds must be > 0")
        if default_max_tokens < 1:
            raise ValueError("default_max_tokens must be >= 1")
        self.regions = regions
        self.latency, self.jitter = float(latency), float(jitter)
        self.faults = fault_rates or Faults()
        self.window_seconds = float(window_seconds)
        self.seed = seed
        self.api_key = api_key or None
        self.models = list(models) or [DEFAULT_MODEL]
        self.default_max_tokens = default_max_tokens
        self.log = log
        self._states = {r.name: _RegionState(r, self.window_seconds, seed) for r in regions}
        self._servers: dict[str, _Server] = {}
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._seen: set[str] = set()
        self._seen_lock = threading.Lock()

    def __repr__(self) -> str:  # never shows the key
        return f"JudgeSim(regions={[r.name for r in self.regions]}, running={self.running})"

    @property
    def running(self) -> bool:
        return bool(self._servers) and not self._stopping.is_set()

    def start(self) -> JudgeSim:
        if self._servers:
            raise RuntimeError("judge-sim already started")
        self._stopping.clear()
        try:
            for region in self.regions:
                self._servers[region.name] = _Server(self, self._states[region.name])
        except OSError:
            for server in self._servers.values():
                server.server_close()
            self._servers.clear()
            raise
        for name, server in self._servers.items():
            t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                                 name=f"judge-sim-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        if not self._servers:
            return
        self._stopping.set()
        servers = list(self._servers.values())
        for server in servers:
            server.shutdown()
            server.server_close()
            server.close_connections()
        for server in servers:
            server.join_handlers(timeout)
        for t in self._threads:
            t.join(timeout)
        self._servers.clear()
        self._threads.clear()

    def __enter__(self) -> JudgeSim:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _server(self, region: str) -> _Server:
        if region not in self._states:
            raise KeyError(f"unknown region {region!r}; have {list(self._states)}")
        if region not in self._servers:
            raise RuntimeError("judge-sim is not running")
        return self._servers[region]

    def port(self, region: str) -> int:
        return self._server(region).server_address[1]

    def azure_endpoint(self, region: str) -> str:
        """For ``openai.AzureOpenAI(azure_endpoint=...)``: ``http://127.0.0.1:PORT``."""
        return f"http://{HOST}:{self.port(region)}"

    def base_url(self, region: str) -> str:
        """For ``openai.OpenAI(base_url=...)``: ``http://127.0.0.1:PORT/v1``."""
        return self.azure_endpoint(region) + "/v1"

    def stats(self, region: str | None = None) -> dict:
        """One region's counters, or ``{name: counters}`` for all."""
        def one(name: str) -> dict:
            server = self._servers.get(name)
            return self._states[name].snapshot(server.server_address[1] if server else 0)
        if region is not None:
            if region not in self._states:
                raise KeyError(f"unknown region {region!r}")
            return one(region)
        return {name: one(name) for name in self._states}

    def reset_stats(self, region: str | None = None, *, clear_limits: bool = False) -> None:
        """Zero the counters (and peaks) of one region or all. ``clear_limits`` also
        empties the rate-limit windows and forgets which ``-once`` requests were seen."""
        for name in ([region] if region is not None else list(self._states)):
            self._states[name].reset(clear_limits)
        if clear_limits:
            with self._seen_lock:
                self._seen.clear()

    def _first_time(self, key: str) -> bool:
        with self._seen_lock:
            if key in self._seen:
                return False
            self._seen.add(key)
            return True


# ---------------------------------------------------------------- CLI

def _region_param(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> list[Region]:
    try:
        regions = [parse_region(v) for v in values]
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return regions


@click.command("judge-sim", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--region", "regions", multiple=True, default=("lab:20000:120",), show_default=True,
              callback=_region_param, metavar="NAME:TPM:RPM[:PORT]",
              help="A simulated region (repeatable); 0 disables a limit; no PORT: a free one.")
@click.option("--latency", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Base latency per request, seconds.")
@click.option("--jitter", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Extra uniform random latency in [0, JITTER) seconds (seeded).")
@click.option("--fail-rate", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Probability of a 500.")
@click.option("--timeout-rate", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Probability of a timeout (hang --timeout-seconds).")
@click.option("--malformed-rate", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Probability of a reply with no valid score.")
@click.option("--timeout-seconds", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="How long a timeout fault hangs.")
@click.option("--timeout-action", type=click.Choice(["drop", "late"]), default="drop",
              show_default=True, help="After hanging: close the connection, or answer late.")
@click.option("--window", type=click.FloatRange(min=0, min_open=True), default=60.0,
              show_default=True, help="Sliding rate-limit window, seconds.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for faults and jitter.")
@click.option("--model", "models", multiple=True, default=(DEFAULT_MODEL,), show_default=True,
              help="Model name listed by /v1/models (repeatable; any model is accepted).")
@click.option("--max-tokens-default", type=click.IntRange(min=1), default=DEFAULT_MAX_TOKENS,
              show_default=True, help="max_tokens assumed at admission when a request has none.")
@click.option("--api-key", envvar="EVALQ_JUDGE_SIM_API_KEY", default=None, metavar="KEY",
              help="Accept only this key (env EVALQ_JUDGE_SIM_API_KEY); default: any key.")
@click.option("-v", "--verbose", is_flag=True, help="Log one line per request to stderr.")
def judge_sim_command(regions: list[Region], latency: float, jitter: float, fail_rate: float,
                      timeout_rate: float, malformed_rate: float, timeout_seconds: float,
                      timeout_action: str, window: float, seed: int, models: tuple[str, ...],
                      max_tokens_default: int, api_key: str | None, verbose: bool) -> None:
    """Serve simulated OpenAI / Azure OpenAI chat endpoints on loopback, one port per
    region, until SIGINT or SIGTERM. Prints `NAME BASE_URL` per region."""
    try:
        faults = Faults(error500=fail_rate, timeout=timeout_rate, malformed=malformed_rate,
                        timeout_seconds=timeout_seconds, timeout_action=timeout_action)
        sim = JudgeSim(regions, latency=latency, jitter=jitter, fault_rates=faults,
                       window_seconds=window, seed=seed, api_key=api_key, models=models,
                       default_max_tokens=max_tokens_default, log=sys.stderr if verbose else None)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        sim.start()
    except OSError as exc:
        raise click.ClickException(f"cannot bind: {exc}") from None
    done = threading.Event()
    previous: dict[int, Any] = {}
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError):  # not the main thread: rely on Ctrl-C
                previous[signum] = signal.signal(signum, lambda *_: done.set())
        for region in sim.regions:
            click.echo(f"{region.name} {sim.base_url(region.name)}")
        sys.stdout.flush()
        click.echo(f"judge-sim: {len(sim.regions)} region(s), window {window:g} s; "
                   "SIGINT/SIGTERM to stop", err=True)
        while not done.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        sim.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m orchestrator.judgesim [options]``; returns the exit code."""
    try:
        judge_sim_command.main(args=list(argv) if argv is not None else None,
                               prog_name="evalq judge-sim", standalone_mode=False)
    except click.exceptions.Abort:
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
