"""docker-compose.yml holds to the security rules (no Docker engine in CI: the file is read)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_redis_needs_a_password_keeps_its_data_and_listens_on_loopback():
    redis = COMPOSE["services"]["redis"]
    command = " ".join(redis["command"])
    assert "--requirepass ${EVALQ_REDIS_PASSWORD:?" in command  # no default: compose refuses without one
    assert "--appendonly yes" in command and "--appendfsync everysec" in command
    assert all(port.startswith("127.0.0.1:") for port in redis["ports"])


def evalq_services() -> dict[str, dict]:
    """The services that run the evalq image (not redis, postgres, prometheus)."""
    return {name: s for name, s in COMPOSE["services"].items() if s.get("image", "").startswith("evalq")}


def test_every_service_reaches_redis_with_the_password_and_flower_has_no_default():
    assert {"jobs", "worker-cpu", "worker-gpu", "worker-judge", "flower"} <= set(evalq_services())
    for name, service in evalq_services().items():
        url = (service.get("environment") or {}).get("EVALQ_BROKER_URL") or COMPOSE["x-evalq"]["environment"]["EVALQ_BROKER_URL"]
        assert url.startswith("redis://:${EVALQ_REDIS_PASSWORD:?"), name
    flower = COMPOSE["services"]["flower"]
    assert flower["environment"]["EVALQ_FLOWER_BASIC_AUTH"].startswith("${EVALQ_FLOWER_BASIC_AUTH:?")
    assert flower["command"][0] == "flower" and all(p.startswith("127.0.0.1:") for p in flower["ports"])


def test_workers_that_hold_keys_have_an_endpoint_allow_list():
    for name in ("worker-judge", "jobs"):
        assert "EVALQ_ENDPOINTS" in COMPOSE["services"][name]["environment"], name


def test_every_published_port_is_on_loopback():
    published = {name: s["ports"] for name, s in COMPOSE["services"].items() if s.get("ports")}
    assert {"redis", "postgres", "jobs", "flower", "prometheus"} <= set(published)
    for name, ports in published.items():
        assert all(port.startswith("127.0.0.1:") for port in ports), name


def test_the_jobs_role_records_history_in_the_postgres_service():
    postgres = COMPOSE["services"]["postgres"]
    assert postgres["image"].split(":")[0] == "postgres"  # the official image
    env = postgres["environment"]
    password = re.fullmatch(r"\$\{(EVALQ_POSTGRES_PASSWORD):-(\w+)\}", env["POSTGRES_PASSWORD"])
    assert password, env["POSTGRES_PASSWORD"]  # from the environment, a default for local use only
    volume, path = postgres["volumes"][0].split(":")[:2]
    assert volume in COMPOSE["volumes"] and path == "/var/lib/postgresql/data"  # the data survives a rebuild
    jobs = COMPOSE["services"]["jobs"]
    url = re.fullmatch(r"postgresql(\+psycopg)?://(\w+):(.+)@postgres:5432/(\w+)", jobs["environment"]["EVALQ_HISTORY_URL"])
    assert url, jobs["environment"]["EVALQ_HISTORY_URL"]
    assert (url.group(2), url.group(3), url.group(4)) == (env["POSTGRES_USER"], env["POSTGRES_PASSWORD"], env["POSTGRES_DB"])
    assert jobs["depends_on"]["postgres"] == {"condition": "service_healthy"} and "healthcheck" in postgres
    assert jobs["environment"]["EVALQ_ALERT_WEBHOOK"] == "${EVALQ_ALERT_WEBHOOK:-}"  # operator configuration
    for name, service in evalq_services().items():  # the store and the webhook belong to the jobs role only
        if name != "jobs":
            assert not {"EVALQ_HISTORY_URL", "EVALQ_ALERT_WEBHOOK"} & set(service.get("environment") or {}), name


def test_prometheus_scrapes_every_worker_on_its_metrics_port_and_loads_the_rules():
    workers = {name: s for name, s in evalq_services().items() if s["command"][0] == "worker"}
    assert set(workers) == {"jobs", "worker-cpu", "worker-gpu", "worker-judge"}
    ports = {name: int(s["environment"]["EVALQ_METRICS_PORT"]) for name, s in workers.items()}
    assert len(set(ports.values())) == 1 and 1024 < ports["jobs"] < 65536
    prometheus = COMPOSE["services"]["prometheus"]
    mounts = dict(v.split(":")[:2] for v in prometheus["volumes"] if v.startswith("./"))
    for source in mounts:
        assert (ROOT / source).is_file(), source
    config_file = next(a.split("=", 1)[1] for a in prometheus["command"] if a.startswith("--config.file="))
    source = next(s for s, target in mounts.items() if target == config_file)
    config = yaml.safe_load((ROOT / source).read_text())
    # the rule file the config names is mounted beside it, from deploy/monitoring/rules.yml
    (rules,) = config["rule_files"]
    assert mounts["./deploy/monitoring/rules.yml"] == str(Path(config_file).parent / rules)
    scraped = {(name, sd["port"]) for job in config["scrape_configs"] for sd in job["dns_sd_configs"]
               for name in sd["names"]}
    assert scraped == {(name, port) for name, port in ports.items()}
    assert all(job["job_name"].startswith("evalq") for job in config["scrape_configs"])  # EvalqMetricsTargetDown


def test_the_cluster_begins_with_the_operators_catalogue():
    """Issue 38: a cluster without a catalogue runs jobs' own deployments on keys of their own, so
    jobs sharing an endpoint overrun its TPM. compose starts the jobs role and the judge workers with
    deploy/catalogue.json (the same as deploy/k8s's ConfigMap), a catalogue evalq reads."""
    import json

    from evalq.shared.judging.deployments import load

    for name in ("jobs", "worker-judge"):
        service = COMPOSE["services"][name]
        assert service["environment"]["EVALQ_CATALOGUE"] == "${EVALQ_CATALOGUE:-/etc/evalq/catalogue.json}", name
        assert "./deploy/catalogue.json:/etc/evalq/catalogue.json:ro" in service["volumes"], name
    catalogue = load(ROOT / "deploy" / "catalogue.json")
    assert catalogue.inline == "deny" and catalogue.deployments
    config = (ROOT / "deploy" / "k8s" / "base" / "config.yaml").read_text()
    block = config[config.index("catalogue.json: |") + len("catalogue.json: |"):]
    k8s = json.loads("\n".join(line[4:] for line in block.splitlines() if line.strip()))
    assert k8s == json.loads((ROOT / "deploy" / "catalogue.json").read_text())
