"""A judge call over HTTP: the chat completions request as the ``openai`` SDK builds it, built once per
SDK client and model, then sent through the SDK client's own connection pool for every call.

``client.post`` (what ``chat.completions.create`` does beneath its typed parameters) builds each call
anew: it copies its options twice, merges headers, prepares the URL (Azure's deployment path), runs its
auth hooks, serializes the body, and wraps the reply in an ``APIResponse``. For a judge that answers in
a few milliseconds that machinery was a third of a judge worker's CPU (issue 73). Here the SDK builds
the request once, for a (client, model): its first call goes through ``client.post`` on a copy of the
client whose HTTP client only records the request (nothing is sent), and the URL, headers and
extensions (timeouts) it made are kept; every call then sends the body as the SDK would serialize it
(``openapi_dumps``: compact JSON, UTF-8) to that URL with those headers, through the client's pool. A
status of 400 or more becomes the SDK's own exception (``openai.BadRequestError``,
``RateLimitError``, ... with the response, its headers and body); a timeout ``openai.APITimeoutError``;
a transport error ``openai.APIConnectionError``: what ``client.post`` raises.

Only clients that carry a plain API key (the ones ``evalq.workers.judge.requests.sdk_client`` makes)
are sent this way; a client whose requests need per-call work (an API key provider, a provider runtime,
workload identity: none of which evalq makes) goes through ``client.post`` every time, as does any
client whose request could not be recorded.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import Any

import openai
from openai._constants import RAW_RESPONSE_HEADER

log = logging.getLogger("evalq.judge")

PATH = "/chat/completions"
# what ``chat.completions.create`` sends besides the body: the raw response back (its headers), the
# client's own authentication
POST_OPTIONS = {"headers": {RAW_RESPONSE_HEADER: "true"}, "security": {"bearer_auth": True}}
# headers of the recorded request that belong to its body or to that one request, not to the route
_PER_REQUEST = {"content-length", "transfer-encoding", "idempotency-key"}
# what would make a client's requests differ call by call (not set on the clients evalq makes)
_PER_CALL_AUTH = ("_api_key_provider", "_provider_runtime", "_workload_identity_auth", "_azure_ad_token_provider")


@dataclass(frozen=True)
class Route:
    """Where and how a (client, model)'s chat calls go: as the SDK built them."""
    url: Any
    headers: tuple[tuple[str, str], ...]
    extensions: dict  # its timeouts (and Azure's scope of its key's header)


_routes: dict[tuple[int, str | None], tuple[Any, Route | None]] = {}  # (id(client), model) -> (client, route)
_lock = threading.Lock()


def post_chat(client, body: dict) -> tuple[dict, Any]:
    """POST ``body`` to the chat completions endpoint as ``client.post`` would (the same URL, headers,
    authentication, body bytes, timeouts and exceptions), the reply read as JSON: (the completion's
    JSON, the reply's headers)."""
    route = route_of(client, body.get("model"))
    if route is None:
        raw = client.post(PATH, body=body, cast_to=object, options=POST_OPTIONS)
        return json.loads(raw.http_response.content), raw.headers
    http = client._client  # the SDK client's own pool
    content = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    request = http.build_request("POST", route.url, headers=list(route.headers), content=content,
                                 extensions=dict(route.extensions))
    try:
        response = http.send(request)
    except _timeouts() as exc:
        raise openai.APITimeoutError(request=request) from exc
    except openai.OpenAIError:
        raise
    except _request_errors() as exc:
        raise openai.APIConnectionError(request=request) from exc
    try:
        if response.status_code >= 400:
            response.read()
            raise client._make_status_error_from_response(response) from None
        return json.loads(response.content), response.headers
    finally:
        response.close()


def route_of(client, model: str | None) -> Route | None:
    """The (client, model)'s route, recorded the first time; None: send through ``client.post``."""
    key = (id(client), model)
    known = _routes.get(key)
    if known is not None and known[0] is client:
        return known[1]
    route = _record(client, model)
    with _lock:
        _routes[key] = (client, route)  # (the client is held, so its id is not reused)
    return route


def _record(client, model: str | None) -> Route | None:
    if type(client) not in (openai.OpenAI, openai.AzureOpenAI) or any(
            getattr(client, name, None) is not None for name in _PER_CALL_AUTH):
        return None
    seen: list = []
    try:
        # the HTTP library the SDK's pool is of (httpx, or httpx2), for a client of its own that records
        http_module = next(__import__(top) for top in (cls.__module__.split(".")[0]
                                                       for cls in type(client._client).__mro__)
                           if top in ("httpx", "httpx2"))

        def handler(request):
            seen.append(request)
            return http_module.Response(200, json={}, request=request)

        recorder = http_module.Client(transport=http_module.MockTransport(handler))
        try:
            client.copy(http_client=recorder).post(PATH, body={"model": model, "messages": []}, cast_to=object,
                                                   options=POST_OPTIONS)
        finally:
            recorder.close()
        request = seen[0]
        headers = tuple((k, v) for k, v in request.headers.multi_items() if k.lower() not in _PER_REQUEST)
        return Route(request.url, headers, dict(request.extensions))
    except Exception as exc:  # noqa: BLE001  (an SDK that builds differently: its own path, every call)
        log.info("judge calls go through the SDK's client.post: its request could not be recorded (%s)", exc)
        return None


def _timeouts() -> tuple[type[BaseException], ...]:
    try:
        from openai._httpx2 import timeout_exceptions
        return timeout_exceptions()
    except ImportError:
        import httpx
        return (httpx.TimeoutException,)


def _request_errors() -> tuple[type[BaseException], ...]:
    try:
        from openai._httpx2 import request_exceptions
        return request_exceptions()
    except ImportError:
        import httpx
        return (httpx.RequestError,)


def forget() -> None:
    """Forget the routes recorded (tests)."""
    with _lock:
        _routes.clear()
