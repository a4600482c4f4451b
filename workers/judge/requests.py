"""How a judge call is made over HTTP: the SDK client of a deployment (its key read only where the
allow-list lets it go), the request body, and what an error says (retry or not, how long to wait)."""

from __future__ import annotations

import functools
import os
import threading
from typing import Any

import openai

from evalq.shared.core.errors import MetricError
from evalq.shared.judging.judges import Deployment, JudgeConfig
from evalq.workers.judge.dialects import refused_as_invalid, shape


class JudgeError(MetricError):
    """The judge could not produce a reply for this item."""


class RateLimited(Exception):
    def __init__(self, retry_after: float):
        self.retry_after = retry_after


_sdk_clients: dict[tuple, Any] = {}
_sdk_lock = threading.Lock()


@functools.lru_cache(maxsize=1)
def _policy():
    from evalq.shared.policy.endpoints import worker_policy

    return worker_policy()


@functools.lru_cache(maxsize=1024)
def _verdict(variable: str, url: str) -> str | None:
    return _policy().problem(variable, url)


def sdk_client(judge: JudgeConfig, d: Deployment, policy=None):
    """One SDK client per (deployment, key) and process; its own retries off. The
    key is read only for an endpoint the allow-list lets it go to (``policy``, an
    ``EndpointPolicy``; default: this worker's ``EVALQ_ENDPOINTS``, read once);
    otherwise ``JudgeError`` and nothing is sent. Chat calls and batch uploads alike."""
    from evalq.shared.policy.endpoints import endpoint_url

    url = endpoint_url(judge.provider, d)
    if policy is None:  # this worker's, read once: its verdict on each (key, endpoint) too
        refused = _verdict(judge.api_key_env, url)
    else:
        refused = policy.problem(judge.api_key_env, url)
    if refused:
        raise JudgeError(f"not sent: {refused}")
    api_key = os.environ.get(judge.api_key_env)
    if not api_key:
        raise JudgeError(f"environment variable {judge.api_key_env} is not set on this worker")
    cache_key = (judge.provider, d.endpoint, d.base_url, judge.api_version, api_key, judge.timeout)
    client = _sdk_clients.get(cache_key)
    if client is not None:
        return client
    with _sdk_lock:
        if cache_key not in _sdk_clients:
            if judge.provider == "azure":
                client = openai.AzureOpenAI(azure_endpoint=d.endpoint, api_version=judge.api_version,
                                            api_key=api_key, max_retries=0, timeout=judge.timeout)
            else:
                client = openai.OpenAI(base_url=d.base_url, api_key=api_key, max_retries=0,
                                       timeout=judge.timeout)
            _sdk_clients[cache_key] = client
        return _sdk_clients[cache_key]


def chat_request(judge: JudgeConfig, messages: list[dict], schema: dict | None = None,
                 schema_name: str = "rating") -> dict:
    """The chat request body of a judge call (its sha256 keys the job's memo and the
    cache): what is sent synchronously, and what a batch line carries."""
    request: dict[str, Any] = {"model": judge.model, "messages": messages,
                               "temperature": judge.temperature, "max_tokens": judge.max_tokens}
    if schema is not None and judge.output != "text":  # ``auto`` is known by this form, whatever carries it
        request["response_format"] = {"type": "json_schema", "json_schema": {
            "name": schema_name, "schema": schema, "strict": True}}
        if judge.output in ("json_object", "tools"):
            request = shape(request, judge.output)
    return request


def retry_after(exc: openai.APIStatusError) -> float:
    headers = exc.response.headers if exc.response is not None else {}
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value:
            try:
                return max(0.0, float(value) / scale)
            except ValueError:
                pass
    return 1.0


def retryable(exc: BaseException) -> bool:
    if isinstance(exc, (openai.APITimeoutError, openai.APIConnectionError, RateLimited)):
        return True
    if refused_as_invalid(exc):  # the same request would be refused again (some servers say so with a 500)
        return False
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in (408, 409) or exc.status_code >= 500
    return False
