"""The operator's allow-list of endpoints per key variable (EVALQ_ENDPOINTS)."""

from __future__ import annotations

import pytest

from evalq.shared.policy.endpoints import EndpointPolicy, job_endpoints

POLICY = EndpointPolicy.parse("AZURE_OPENAI_API_KEY=https://*.openai.azure.com; "
                              "OPENAI_API_KEY=https://api.openai.com/v1\nLOCAL=http://127.0.0.1:*,http://10.0.0.5:8000/v1")


@pytest.mark.parametrize("var,url,allowed", [
    ("AZURE_OPENAI_API_KEY", "https://myres.openai.azure.com", True),
    ("AZURE_OPENAI_API_KEY", "https://myres.openai.azure.com/", True),
    ("AZURE_OPENAI_API_KEY", "https://myres.openai.azure.com:443/openai", True),
    ("AZURE_OPENAI_API_KEY", "https://evil.com/x.openai.azure.com", False),   # a path is not a host
    ("AZURE_OPENAI_API_KEY", "https://myres.openai.azure.com.evil.com", False),
    ("AZURE_OPENAI_API_KEY", "https://myres.openai.azure.com@evil.com", False),
    ("AZURE_OPENAI_API_KEY", "https://evil.com#.openai.azure.com", False),
    ("AZURE_OPENAI_API_KEY", "http://myres.openai.azure.com", False),        # scheme
    ("AZURE_OPENAI_API_KEY", "https://myres.openai.azure.com:8443", False),  # port
    ("OPENAI_API_KEY", "https://api.openai.com/v1", True),
    ("OPENAI_API_KEY", "https://api.openai.com/v1/", True),
    ("OPENAI_API_KEY", "https://api.openai.com/v10", False),                 # a path prefix is whole segments
    ("OPENAI_API_KEY", "https://myres.openai.azure.com", False),             # another variable's endpoint
    ("LOCAL", "http://127.0.0.1:41234/v1", True),
    ("LOCAL", "http://10.0.0.5:8000/v1", True),
    ("LOCAL", "http://10.0.0.5:8001/v1", False),
    ("UNLISTED", "https://api.openai.com/v1", False),
])
def test_patterns(var, url, allowed):
    assert POLICY.allows(var, url) is allowed


def test_a_wildcard_variable_and_the_refusal_message():
    policy = EndpointPolicy.parse("*=http://127.0.0.1:*")
    assert policy.allows("ANY_API_KEY", "http://127.0.0.1:5/v1") and not policy.allows("ANY_API_KEY", "http://10.1.1.1/v1")
    message = POLICY.problem("OPENAI_API_KEY", "https://evil.example/v1")
    assert "https://evil.example/v1" in message and "OPENAI_API_KEY" in message and "https://api.openai.com/v1" in message


@pytest.mark.parametrize("text", ["NOEQUALS", "=https://x", "K=ftp://x", "K=not a url"])
def test_bad_lists_are_refused(text):
    with pytest.raises(ValueError):
        EndpointPolicy.parse(text)


def test_embedded_lists_exactly_the_jobs_endpoints():
    from evalq.shared.judging.judges import JudgeConfig

    judge = JudgeConfig.model_validate({"provider": "openai", "model": "m", "api_key_env": "K", "deployments": [
        {"region": "a", "base_url": "http://127.0.0.1:9001/v1/", "tpm": 1, "rpm": 1},
        {"region": "b", "base_url": "https://llm.example/v1", "tpm": 1, "rpm": 1}]})
    policy = EndpointPolicy.parse(job_endpoints([judge]))
    assert policy.allows("K", "http://127.0.0.1:9001/v1") and policy.allows("K", "https://llm.example/v1")
    assert not policy.allows("K", "http://127.0.0.1:9002/v1") and not policy.allows("OTHER", "https://llm.example/v1")


@pytest.mark.parametrize("variable", ["AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "EVALQ_BROKER_URL",
                                      "EVALQ_REDIS_KEY_FILE", "EVALQ_SOMETHING_API_KEY", "HOME", "PATH",
                                      "DATABASE_PASSWORD"])
def test_a_wildcard_never_sends_settings_or_cloud_credentials(variable):
    """Attack: with ``*=http://host/v1`` a job named ``api_key_env: AWS_SECRET_ACCESS_KEY`` and the
    worker sent it as a Bearer token. ``*`` covers only declared key variables, never EVALQ_*/AWS_*."""
    policy = EndpointPolicy.parse("*=http://127.0.0.1:*")
    assert not policy.allows(variable, "http://127.0.0.1:5/v1")
    assert "does not cover" in policy.problem(variable, "http://127.0.0.1:5/v1")


def test_the_operator_declares_which_variables_a_wildcard_covers():
    policy = EndpointPolicy.from_env({"EVALQ_ENDPOINTS": "*=http://127.0.0.1:*",
                                      "EVALQ_KEY_VARIABLES": "JUDGE_TOKEN_*, *_API_KEY"})
    assert policy.allows("JUDGE_TOKEN_EU", "http://127.0.0.1:5/v1")
    assert policy.allows("OPENAI_API_KEY", "http://127.0.0.1:5/v1")
    assert not policy.allows("AWS_API_KEY", "http://127.0.0.1:5/v1")  # AWS_* never, even when declared
    # a variable named explicitly is the operator's own choice
    assert EndpointPolicy.parse("MY_TOKEN=http://127.0.0.1:*").allows("MY_TOKEN", "http://127.0.0.1:5/v1")
