"""How a judge is asked for structured output, per deployment (``output: auto``): the bodies
each dialect sends, which refusals move to the next one, and what the cluster remembers.
The real server that refuses ``json_schema`` is in tests/integration/test_llama_server.py."""

from __future__ import annotations

import httpx
import openai
import pytest
import redis

from evalq.shared.cluster import keys
from evalq.shared.judging.judges import JudgeConfig
from evalq.workers.judge import dialects
from evalq.workers.judge.client import chat_request, retryable as _retryable

SCHEMA = {"type": "object", "properties": {"score": {"type": "integer"}}, "required": ["score"]}
MESSAGES = [{"role": "system", "content": "You grade answers."}, {"role": "user", "content": "Grade this."}]


def judge(output: str = "auto") -> JudgeConfig:
    return JudgeConfig.model_validate({"provider": "openai", "model": "m", "api_key_env": "K", "output": output,
                                       "deployments": [
        {"region": "lab", "base_url": "http://127.0.0.1:1/v1", "tpm": 1000, "rpm": 10}]})


def status_error(status: int, message: str) -> openai.APIStatusError:
    request = httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions")
    response = httpx.Response(status, request=request, json={"error": {"message": message}})
    cls = {400: openai.BadRequestError, 422: openai.UnprocessableEntityError, 500: openai.InternalServerError}[status]
    return cls(message, response=response, body={"error": {"message": message}})


def test_auto_is_known_by_its_json_schema_request():
    """The digest (memo, cache, batch line) of an auto judge's call is that of the json_schema form:
    a reply is found again whatever dialect carried it, and caches made before auto still answer."""
    assert chat_request(judge("auto"), MESSAGES, SCHEMA) == chat_request(judge("json_schema"), MESSAGES, SCHEMA)
    assert chat_request(judge("auto"), MESSAGES)["messages"] == MESSAGES  # no schema: nothing to ask for


def test_each_dialect_asks_for_the_schema_its_own_way():
    request = chat_request(judge(), MESSAGES, SCHEMA, "rating")
    assert dialects.shape(request, "json_schema") == request
    as_object = dialects.shape(request, "json_object")
    assert as_object["response_format"] == {"type": "json_object", "schema": SCHEMA}
    assert as_object["messages"][0]["content"].startswith("You grade answers.\n\nAnswer with only a JSON object")
    assert '"required":["score"]' in as_object["messages"][0]["content"] and as_object["messages"][1:] == MESSAGES[1:]
    as_tools = dialects.shape(request, "tools")
    assert as_tools["tools"][0]["function"]["parameters"] == SCHEMA and "response_format" not in as_tools
    assert as_tools["tool_choice"] == {"type": "function", "function": {"name": "rating"}}
    assert as_tools["messages"] == MESSAGES
    as_text = dialects.shape(request, "text")
    assert "response_format" not in as_text and "tools" not in as_text
    assert "JSON schema" in as_text["messages"][0]["content"]
    no_system = dialects.shape(chat_request(judge(), MESSAGES[1:], SCHEMA), "text")["messages"]
    assert no_system[0]["role"] == "system" and no_system[1:] == MESSAGES[1:]
    # an explicit dialect is that dialect's body, from the start
    assert chat_request(judge("json_object"), MESSAGES, SCHEMA, "rating") == as_object
    assert chat_request(judge("tools"), MESSAGES, SCHEMA, "rating") == as_tools


def test_a_refusal_of_the_output_form_is_told_from_other_errors():
    llama = status_error(500, 'response_format type must be one of "text" or "json_object", but got: json_schema')
    assert dialects.refused_as_invalid(llama) and not _retryable(llama)  # never sent again as it was
    assert dialects.refused_as_invalid(status_error(400, "Invalid parameter: 'response_format' of type "
                                                         "'json_schema' is not supported with this model."))
    assert dialects.refused_as_invalid(status_error(422, "tool_choice: unsupported value"))
    too_long = status_error(400, "This model's maximum context length is 8192 tokens.")
    assert not dialects.refused_as_invalid(too_long)
    overloaded = status_error(500, "The server had an error while processing your request.")
    assert not dialects.refused_as_invalid(overloaded) and _retryable(overloaded)


def test_what_a_deployment_refused_is_remembered_for_the_cluster(redis_url):
    r = redis.Redis.from_url(redis_url)
    dep = "dialect-test-deployment"
    r.delete(keys.dialect(dep))
    dialects.forget()
    known = dialects.Dialects(r)
    assert known.current(dep) == "json_schema"
    refusal = status_error(500, "got: json_schema")
    assert known.refused(dep, "lab", "json_schema", refusal) == "json_object"
    assert r.get(keys.dialect(dep)) == b"json_object" and 0 < r.ttl(keys.dialect(dep)) <= dialects.REMEMBER_S
    dialects.forget()  # another worker process: it starts from what the cluster learnt
    assert dialects.Dialects(r).current(dep) == "json_object"
    assert known.refused(dep, "lab", "json_object", refusal) == "tools"
    assert known.refused(dep, "lab", "json_schema", refusal) == "json_object"  # a late word from a slower worker
    assert r.get(keys.dialect(dep)) == b"tools" and known.current(dep) == "tools"  # ... undoes nothing
    assert known.refused(dep, "lab", "tools", refusal) == "text"
    assert known.refused(dep, "lab", "text", refusal) is None  # nothing after text: the error stands
    dialects.forget()
    r.delete(keys.dialect(dep))


@pytest.mark.parametrize("output", ["auto", "json_schema", "json_object", "tools", "text"])
def test_every_output_form_is_a_valid_setting(output):
    assert judge(output).output == output
