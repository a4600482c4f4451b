"""How a judge is asked for structured output, per deployment: OpenAI-compatible servers speak
different dialects of it, and a user pointing evalq at llama.cpp, Ollama, vLLM or LM Studio
should not have to know which.

A judge whose ``output`` is ``auto`` (the default) is asked in the first dialect of ``ORDER``
that its deployment has not refused: ``json_schema`` (OpenAI's ``response_format``), then
``json_object`` with the schema inside (llama.cpp's and others' form), then a forced
``tools`` call, then ``text`` (the schema in the instructions; the reply is read as JSON all
the same, and checked). A server that refuses a dialect as an invalid request (HTTP 400 or 422,
or llama-cpp-python's 500, naming the field) is asked again at once in the next one, without
a retry; what a deployment refused is remembered in Redis for a day (every worker and job of
the cluster starts from what worked) and in the process.

The request a call is known by (its digest: the job's memo, the cache, a batch line) is the
``json_schema`` one whatever dialect carries it, so a reply is found again after a fallback.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import openai
import redis

from evalq.shared.cluster import keys
from evalq.workers.judge.transport import post_chat

log = logging.getLogger("evalq.judge")

ORDER = ("json_schema", "json_object", "tools", "text")
REMEMBER_S = 24 * 3600  # how long a deployment's refusal of a dialect is remembered
# Words of a refusal that is about how the output was asked for (not, say, a context too long)
_MARKERS = ("response_format", "json_schema", "json_object", "tool_choice", "tools", "function")
_INSTRUCTION = "Answer with only a JSON object that is valid for this JSON schema: {schema}"

_known: dict[str, tuple[str, float]] = {}  # deployment id -> (its dialect, when learnt), in this process
_lock = threading.Lock()


def refused_as_invalid(exc: BaseException) -> bool:
    """A reply saying the request itself is invalid because of how the output was asked for:
    not worth retrying as it is, worth asking in another dialect."""
    if not isinstance(exc, openai.APIStatusError) or exc.status_code not in (400, 415, 422, 500):
        return False
    text = f"{exc.message} {exc.body if exc.body is not None else ''}".lower()
    return any(marker in text for marker in _MARKERS)


def shape(request: dict, dialect: str) -> dict:
    """The body of ``request`` (as ``chat_request`` makes it in the ``json_schema`` dialect)
    in ``dialect``; a request without a schema is sent as it is."""
    fmt = request.get("response_format") or {}
    if fmt.get("type") != "json_schema" or dialect == "json_schema":
        return dict(request)
    wanted = fmt["json_schema"]
    body = {k: v for k, v in request.items() if k != "response_format"}
    if dialect == "tools":
        body["tools"] = [{"type": "function", "function": {
            "name": wanted["name"], "description": "Submit the evaluation.", "parameters": wanted["schema"]}}]
        body["tool_choice"] = {"type": "function", "function": {"name": wanted["name"]}}
        return body
    body["messages"] = _instructed(request["messages"], wanted["schema"])
    if dialect == "json_object":
        body["response_format"] = {"type": "json_object", "schema": wanted["schema"]}
    return body


def _instructed(messages: list[dict], schema: dict) -> list[dict]:
    """The messages with the schema stated in the system message (added first if none)."""
    instruction = _INSTRUCTION.format(schema=json.dumps(schema, separators=(",", ":")))
    if messages and messages[0].get("role") == "system" and isinstance(messages[0].get("content"), str):
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{instruction}"}, *messages[1:]]
    return [{"role": "system", "content": instruction}, *messages]


class Dialects:
    """The dialect each deployment is asked in (``output: auto``)."""

    def __init__(self, r: redis.Redis):
        self.r = r

    def current(self, dep_id: str) -> str:
        """The deployment's dialect: what this process learnt (for a day), else the cluster's."""
        with _lock:
            known = _known.get(dep_id)
            if known is not None and time.monotonic() - known[1] < REMEMBER_S:
                return known[0]
        try:
            stored = self.r.get(keys.dialect(dep_id))
        except redis.RedisError:
            stored = None
        dialect = stored.decode() if stored and stored.decode() in ORDER else ORDER[0]
        with _lock:
            _known[dep_id] = (dialect, time.monotonic())
            return dialect

    def create(self, client, request: dict, dep_id: str, region: str, auto: bool, model: str | None = None):
        """The chat call through the SDK ``client`` (``model``: Azure's deployment name): the completion
        (as its JSON says it, ``post_chat``) and the reply's headers (rate-limit headers teach
        ``evalq.workers.judge.learning``). With
        ``auto``, in the dialect the deployment speaks, and when its server refuses that one
        as invalid, at once in the next; otherwise ``request`` as it is."""
        dialect = self.current(dep_id) if auto else None
        while True:
            body = shape(request, dialect) if dialect is not None else dict(request)
            if model is not None:
                body["model"] = model
            try:
                return post_chat(client, body)
            except openai.APIStatusError as exc:
                if dialect is None or not refused_as_invalid(exc):
                    raise
                dialect = self.refused(dep_id, region, dialect, exc)
                if dialect is None:
                    raise

    def refused(self, dep_id: str, region: str, dialect: str, exc: openai.APIStatusError) -> str | None:
        """``dialect`` was refused: the next one to ask in (remembered), or None after ``text``."""
        at = ORDER.index(dialect)
        if at + 1 >= len(ORDER):
            return None
        nxt = ORDER[at + 1]
        with _lock:
            if ORDER.index(_known.get(dep_id, (ORDER[0], 0.0))[0]) < at + 1:
                _known[dep_id] = (nxt, time.monotonic())
                log.warning("judge deployment %s refused structured output as %s (HTTP %s: %s); asking as %s "
                            "from now on", region, dialect, exc.status_code, str(exc.message)[:160], nxt)
        try:
            # only forward: a worker that learnt less never undoes what another learnt
            self.r.eval(_FORWARD, 1, keys.dialect(dep_id), nxt, str(REMEMBER_S), *ORDER)
        except redis.RedisError:
            pass
        return nxt


# KEYS: the deployment's dialect; ARGV: the dialect, ttl, then ORDER. Set it unless it is further on.
_FORWARD = """
local now = redis.call('GET', KEYS[1])
local rank = {}
for i = 3, #ARGV do rank[ARGV[i]] = i end
if now == false or rank[now] == nil or rank[now] < rank[ARGV[1]] then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
end
return 1
"""


def forget() -> None:
    """Forget what this process learnt (tests)."""
    with _lock:
        _known.clear()
