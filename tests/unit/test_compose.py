"""docker-compose.yml holds to the security rules (no Docker engine in CI: the file is read)."""

from __future__ import annotations

from pathlib import Path

import yaml

COMPOSE = yaml.safe_load((Path(__file__).resolve().parents[2] / "docker-compose.yml").read_text())


def test_redis_needs_a_password_keeps_its_data_and_listens_on_loopback():
    redis = COMPOSE["services"]["redis"]
    command = " ".join(redis["command"])
    assert "--requirepass ${EVALQ_REDIS_PASSWORD:?" in command  # no default: compose refuses without one
    assert "--appendonly yes" in command and "--appendfsync everysec" in command
    assert all(port.startswith("127.0.0.1:") for port in redis["ports"])


def test_every_service_reaches_redis_with_the_password_and_flower_has_no_default():
    for name, service in COMPOSE["services"].items():
        url = (service.get("environment") or {}).get("EVALQ_BROKER_URL") or COMPOSE["x-evalq"]["environment"]["EVALQ_BROKER_URL"]
        if name != "redis":
            assert url.startswith("redis://:${EVALQ_REDIS_PASSWORD:?"), name
    flower = COMPOSE["services"]["flower"]
    assert flower["environment"]["EVALQ_FLOWER_BASIC_AUTH"].startswith("${EVALQ_FLOWER_BASIC_AUTH:?")
    assert flower["command"][0] == "flower" and all(p.startswith("127.0.0.1:") for p in flower["ports"])


def test_workers_that_hold_keys_have_an_endpoint_allow_list():
    for name in ("worker-judge", "jobs"):
        assert "EVALQ_ENDPOINTS" in COMPOSE["services"][name]["environment"], name
