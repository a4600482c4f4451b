"""A request queue's message made data before Celery sees it.

A message on ``evalq.jobs`` or ``evalq.jobs.<tenant>`` is a JSON document its sender writes whole
(an LPUSH is all a tenant's Redis user may do), and Celery runs more than a task's kwargs: the
third element of a protocol 2 body (``callbacks``, ``errbacks``, ``chain``, ``chord``) is published
by the worker's tracer after the task returns, with the worker's own connection, onto whatever
queue its signatures name (another tenant's request queue, a work queue, the control queue); the
headers carry ``eta``/``countdown`` (held in the worker), ``expires``, ``retries``, time limits,
``group``, ``shadow`` and stamps. So the jobs worker rebuilds every request message from its task,
its id and its kwargs alone (``rebuild``), in the transport, before Celery or kombu reads it:

- protocol 2 (the task in the headers) and protocol 1 (the task, id and kwargs in the body: what
  celery-node sends with ``TASK_PROTOCOL: 1``, and Celery 3 clients) are both read;
- a message that is not a request is refused (``Refused``): another task, a body that is not JSON,
  positional arguments, kwargs that are not an object, or a canvas of any kind (a callback, errback,
  chain, chord or group member); it is answered ``invalid`` on its ``reply_to`` where that is one of
  its tenant's lists, counted (``evalq_requests_refused_total{queue,reason}``) and logged, never run
  (``evalq.orchestrator.service.answer_refused``);
- whatever else a sender may set (eta, countdown, expires, retries, time limits, priority, shadow
  name, stamps, root and parent ids, the ``reply_to`` and ``correlation_id`` properties Celery's
  RPC results use) is ignored: the message Celery sees has headers of evalq's making.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json

REQUEST_TASK = "evalq.submit_job"
CANVAS = ("callbacks", "errbacks", "chain", "chord")


class Refused(Exception):
    """A message on a request queue that is not a request: ``reason`` (a word, for the counter),
    ``message`` (what its sender is told), and what could be read of its kwargs (for its reply)."""

    def __init__(self, reason: str, message: str, kwargs: dict | None = None):
        super().__init__(message)
        self.reason, self.message, self.kwargs = reason, message, kwargs or {}


def _body(message: dict) -> object:
    props = message.get("properties") or {}
    content_type = message.get("content-type") or "application/json"
    if content_type != "application/json":
        raise Refused("unreadable", f"request: content-type {str(content_type)[:80]!r}; requests are JSON "
                                    "(application/json)")
    raw = message.get("body")
    if not isinstance(raw, str):
        raise Refused("unreadable", "request: its body is not a string")
    try:
        text = base64.b64decode(raw, validate=True).decode() if props.get("body_encoding") == "base64" else raw
        return json.loads(text)
    except (binascii.Error, UnicodeDecodeError, ValueError, RecursionError):
        raise Refused("unreadable", "request: its body is not JSON (base64-encoded where body_encoding says "
                                    "base64)") from None


def _read(message: dict) -> tuple[str | None, object, object, dict, object]:
    """(task, task id, args, kwargs, canvas) of a protocol 2 or protocol 1 message."""
    headers = message.get("headers") or {}
    body = _body(message)
    if "task" in headers:  # protocol 2: [args, kwargs, embed]
        if not isinstance(body, list) or len(body) != 3:
            raise Refused("unreadable", "request: a protocol 2 body is [args, kwargs, embed]")
        args, kwargs, embed = body
        canvas = {k: embed.get(k) for k in CANVAS} if isinstance(embed, dict) else embed
        return headers.get("task"), headers.get("id"), args, kwargs, canvas
    if not isinstance(body, dict):  # protocol 1: the task's fields are the body
        raise Refused("unreadable", "request: a message names its task in its headers (Celery protocol 2) "
                                    "or in its body (protocol 1)")
    canvas = {k: body.get(k) for k in ("callbacks", "errbacks", "chord")}
    canvas["group"] = body.get("taskset")
    return body.get("task"), body.get("id"), body.get("args"), body.get("kwargs"), canvas


def rebuild(message: dict, queue: str) -> dict:
    """The message ``message`` taken from request queue ``queue`` becomes, for Celery: protocol 2,
    task ``evalq.submit_job``, its id, its kwargs, nothing else. ``Refused`` where it is not a request."""
    from celery.utils.saferepr import saferepr

    if not isinstance(message, dict):
        raise Refused("unreadable", "request: a message is a JSON object")
    task, task_id, args, kwargs, canvas = _read(message)
    readable = kwargs if isinstance(kwargs, dict) else {}
    if task != REQUEST_TASK:
        raise Refused("not_a_request", f"request: task {str(task)[:80]!r}; a request queue carries only "
                                       f"{REQUEST_TASK}", readable)
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise Refused("unreadable", "request: its kwargs are a JSON object of the request's fields")
    if args not in (None, [], ()):
        raise Refused("arguments", f"request: positional arguments; {REQUEST_TASK} takes the request's fields "
                                   "as kwargs (job or job_uri, out, request_id, reply_to, ...)", readable)
    asked = sorted(k for k, v in canvas.items() if v) if isinstance(canvas, dict) else ["embed"]
    if asked:
        raise Refused("canvas", f"request: asks for {', '.join(asked)}; a request is data: it runs nothing but "
                                "itself (no callbacks, errbacks, chain, chord or group)", readable)
    if not (isinstance(task_id, str) and 0 < len(task_id) <= 200):
        # a redelivered copy has the same body, so the same id: the request stays one request
        task_id = "sha256-" + hashlib.sha256(str(message.get("body")).encode()).hexdigest()[:40]
    body = json.dumps([[], kwargs, dict.fromkeys(CANVAS)])
    props = message.get("properties") if isinstance(message.get("properties"), dict) else {}
    return {
        "body": base64.b64encode(body.encode()).decode(), "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {"lang": "py", "task": REQUEST_TASK, "id": task_id, "root_id": task_id, "parent_id": None,
                    "group": None, "retries": 0, "eta": None, "expires": None, "timelimit": [None, None],
                    "shadow": None, "argsrepr": "()", "kwargsrepr": saferepr(kwargs, 1024),
                    "origin": f"queue {queue}"},
        # delivery_info and delivery_tag are the transport's own (evalq.orchestrator.app.stamp_consumed_queue)
        "properties": {"correlation_id": task_id, "reply_to": "", "delivery_mode": 2, "priority": 0,
                       "body_encoding": "base64", "delivery_info": props.get("delivery_info"),
                       "delivery_tag": props.get("delivery_tag")},
    }
