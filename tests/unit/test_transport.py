"""A judge call's HTTP request, built once per (client, model) by the SDK and sent through its pool
(``evalq.workers.judge.transport``): the same bytes on the wire as ``client.post`` sends, and the same
exceptions back. Both paths here go to one HTTP transport that records what it is sent and answers as
the test says (an in-process ``MockTransport``: the thing compared is what the SDK builds, not a
server); a real judge-sim and llama.cpp server answer these calls in the integration tests."""

from __future__ import annotations

import json

import openai
import openai._base_client
import pytest

from evalq.workers.judge import transport

# the HTTP library the SDK is built on (httpx2 in the SDK's recent releases, httpx before)
httpx = getattr(openai._base_client, "httpx2", None) or __import__("httpx")

BODY = {"model": "dep-1", "messages": [{"role": "system", "content": "Grade it."},
                                       {"role": "user", "content": "Réponse: « oui » \u2013 42"}],
        "temperature": 0, "max_tokens": 50,
        "response_format": {"type": "json_schema", "json_schema": {"name": "rating", "strict": True,
                                                                   "schema": {"type": "object"}}}}


class Recorder:
    def __init__(self, status: int = 200, payload: dict | None = None, headers: dict | None = None,
                 raise_: Exception | None = None):
        self.seen: list = []
        self.status, self.payload, self.headers, self.raise_ = status, payload, headers or {}, raise_

    def __call__(self, request):
        request.read()
        self.seen.append(request)
        if self.raise_ is not None:
            raise self.raise_
        return httpx.Response(self.status, json=self.payload if self.payload is not None else {"choices": []},
                              headers=self.headers, request=request)


def clients(recorder: Recorder) -> list:
    def http():
        return httpx.Client(transport=httpx.MockTransport(recorder))
    return [openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="sk-one", max_retries=0, timeout=7.5,
                          http_client=http()),
            openai.AzureOpenAI(azure_endpoint="http://127.0.0.1:9", api_version="2024-06-01", api_key="az-two",
                               max_retries=0, timeout=7.5, http_client=http())]


def wire(request) -> tuple:
    headers = {k.lower(): v for k, v in request.headers.items() if k.lower() not in ("idempotency-key",)}
    return request.method, str(request.url), headers, request.content, dict(request.extensions)


@pytest.fixture(autouse=True)
def _forget():
    transport.forget()
    yield
    transport.forget()


def test_a_call_is_the_request_the_sdk_sends():
    """OpenAI's and Azure's (its deployment's path, api-version and api-key header): method, URL,
    every header, body bytes and timeouts equal what ``client.post`` sends, call after call."""
    recorder = Recorder(payload={"choices": [{"message": {"content": "{}"}}]}, headers={"x-ratelimit-limit-tokens": "9"})
    for client in clients(recorder):
        recorder.seen.clear()
        sdk = client.post(transport.PATH, body=BODY, cast_to=object, options=transport.POST_OPTIONS)
        data, headers = transport.post_chat(client, BODY)
        again, _ = transport.post_chat(client, {**BODY, "temperature": 0.5})
        assert transport.route_of(client, "dep-1") is not None  # the fast path, not client.post
        by_sdk, ours, second = recorder.seen
        assert wire(ours) == wire(by_sdk)
        assert json.loads(second.content)["temperature"] == 0.5 and second.headers["content-length"] == str(
            len(second.content))
        assert data == json.loads(sdk.http_response.content) and headers["x-ratelimit-limit-tokens"] == "9"
        assert ("deployments/dep-1" in str(ours.url)) == isinstance(client, openai.AzureOpenAI)


@pytest.mark.parametrize("status,cls", [(400, openai.BadRequestError), (401, openai.AuthenticationError),
                                        (422, openai.UnprocessableEntityError), (429, openai.RateLimitError),
                                        (500, openai.InternalServerError), (503, openai.InternalServerError)])
def test_a_refusal_is_the_sdks_exception(status, cls):
    """The class, message, body, status and headers (Retry-After) of the SDK's own exception."""
    recorder = Recorder(status, {"error": {"message": "response_format is not supported"}}, {"retry-after": "3"})
    client = clients(recorder)[0]
    with pytest.raises(cls) as by_sdk:
        client.post(transport.PATH, body=BODY, cast_to=object, options=transport.POST_OPTIONS)
    with pytest.raises(cls) as ours:
        transport.post_chat(client, BODY)
    assert (ours.value.status_code, ours.value.message, ours.value.body) == (
        by_sdk.value.status_code, by_sdk.value.message, by_sdk.value.body)
    assert ours.value.response.headers["retry-after"] == "3"


@pytest.mark.parametrize("error,cls", [(httpx.ReadTimeout("slow"), openai.APITimeoutError),
                                       (httpx.ConnectError("refused"), openai.APIConnectionError)])
def test_a_transport_failure_is_the_sdks_exception(error, cls):
    client = clients(Recorder(raise_=error))[0]
    with pytest.raises(cls):
        client.post(transport.PATH, body=BODY, cast_to=object, options=transport.POST_OPTIONS)
    with pytest.raises(cls):
        transport.post_chat(client, BODY)


def test_a_client_with_per_call_auth_goes_through_the_sdk():
    """A key provider (evalq never makes one) would make each request's header anew: client.post each time."""
    recorder = Recorder()
    client = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key=lambda: "sk-fresh", max_retries=0,
                           http_client=httpx.Client(transport=httpx.MockTransport(recorder)))
    assert transport.route_of(client, "dep-1") is None
    transport.post_chat(client, BODY)
    assert recorder.seen[0].headers["authorization"] == "Bearer sk-fresh"
