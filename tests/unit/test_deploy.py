"""deploy/k8s renders offline (kubectl kustomize), every object validates against
the Kubernetes schemas (kubernetes-validate, offline), KEDA objects are checked
field by field, and the worker commands, queues and settings in the manifests and
in docker-compose match the CLI (no drift)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir())
KUBERNETES = "1.32"
QUEUE = re.compile(r"^(cpu|gpu|evalq\.jobs|(judge|generate)\.[A-Za-z0-9_-]+)$")


def render(overlay: str) -> list[dict]:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is needed to render the kustomizations offline")
    out = subprocess.run(["kubectl", "kustomize", str(K8S / "overlays" / overlay)], capture_output=True, text=True,
                         check=True, timeout=60)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_both_overlays_exist():
    assert OVERLAYS == ["dev", "production"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_against_the_kubernetes_schemas(overlay):
    import kubernetes_validate

    docs = render(overlay)
    assert {d["kind"] for d in docs} >= {"StatefulSet", "Deployment", "Service", "CronJob", "NetworkPolicy",
                                         "PodDisruptionBudget", "ScaledObject", "TriggerAuthentication", "ConfigMap"}
    for doc in docs:
        if doc["apiVersion"].startswith("keda.sh/"):
            continue  # not a Kubernetes API: checked below
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def worker_queues(doc: dict) -> list[str]:
    args = doc["spec"]["template"]["spec"]["containers"][0]["args"]
    return args[args.index("--queues") + 1].split(",")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_keda_objects_scale_existing_workers_on_their_own_queues(overlay):
    docs = render(overlay)
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    auths = {d["metadata"]["name"] for d in docs if d["kind"] == "TriggerAuthentication"}
    scaled = [d for d in docs if d["kind"] == "ScaledObject"]
    assert {s["spec"]["scaleTargetRef"]["name"] for s in scaled} == {"evalq-worker-cpu", "evalq-worker-gpu",
                                                                      "evalq-worker-judge"}
    for s in scaled:
        assert s["apiVersion"] == "keda.sh/v1alpha1"
        spec = s["spec"]
        assert set(spec) <= {"scaleTargetRef", "minReplicaCount", "maxReplicaCount", "cooldownPeriod",
                             "pollingInterval", "triggers"}
        target = deployments[spec["scaleTargetRef"]["name"]]
        assert 0 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
        for trigger in spec["triggers"]:
            assert trigger["type"] == "redis" and trigger["authenticationRef"]["name"] in auths
            meta = trigger["metadata"]
            assert set(meta) == {"address", "databaseIndex", "listName", "listLength"}
            assert all(isinstance(v, str) for v in meta.values())  # KEDA metadata values are strings
            assert int(meta["listLength"]) > 0
            assert meta["listName"] in worker_queues(target)  # scales on a queue the worker consumes
    gpu = next(s for s in scaled if s["spec"]["scaleTargetRef"]["name"] == "evalq-worker-gpu")
    assert gpu["spec"]["minReplicaCount"] == 0  # to zero when idle


def cli_accepts(args: list[str]) -> None:
    """Parse a container's evalq arguments with the real CLI (click), without running it."""
    from evalq.orchestrator.cli import cli

    command = cli.commands[args[0]]
    command.make_context(args[0], list(args[1:]))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_manifests_match_the_cli_and_its_settings(overlay):
    docs = render(overlay)
    readme = (ROOT / "README.md").read_text()
    for doc in docs:
        if doc["kind"] not in ("Deployment", "StatefulSet", "CronJob"):
            continue
        pod = doc["spec"]["jobTemplate"]["spec"]["template"]["spec"] if doc["kind"] == "CronJob" \
            else doc["spec"]["template"]["spec"]
        for container in pod["containers"]:
            if not container["image"].endswith(("evalq", "evalq:latest")) and "evalq" not in container["image"]:
                continue
            if container.get("args") and container["args"][0] in ("worker", "flower"):
                cli_accepts(container["args"])
                if container["args"][0] == "worker":
                    assert all(QUEUE.match(q) for q in worker_queues(doc)), worker_queues(doc)
            for env in container.get("env", []):
                if env["name"].startswith("EVALQ_") and env["name"] != "EVALQ_REDIS_PASSWORD":
                    assert f"`{env['name']}`" in readme, env["name"]
            if doc["metadata"]["name"] != "evalq-redis":
                assert pod["securityContext"]["runAsNonRoot"] is True
            for name, value in ((e["name"], e.get("value", "")) for e in container.get("env", [])):
                assert not re.search(r"(sk-|password=|://[^:@/]*:[^$@/][^@/]*@)", value), (name, value)
    config = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "evalq-config")
    for key in config["data"]:
        assert f"`{key}`" in readme, key  # every setting the manifests set is documented
    secrets_written = [d for d in docs if d["kind"] == "Secret"]
    assert not secrets_written  # keys and passwords only by reference
    workers = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment" and "worker" in d["metadata"]["name"]}
    for d in workers.values():  # only the jobs role runs callbacks (and holds S3 credentials)
        assert "--no-control" in d["spec"]["template"]["spec"]["containers"][0]["args"]
        assert d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > 3600


def test_docker_compose_commands_match_the_cli():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for name, service in compose["services"].items():
        if name == "redis":
            continue
        command = [c for c in service["command"]]
        cli_accepts([c.replace("${EVALQ_JUDGE_QUEUES:-", "").rstrip("}") for c in command])
