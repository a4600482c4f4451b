"""deploy/k8s renders offline (kubectl kustomize), every object validates against
the Kubernetes schemas (kubernetes-validate, offline), KEDA objects validate against
KEDA's CRD schema kept in deploy/k8s/schemas and are checked for what evalq needs of
them, and the worker commands, queues and settings in the manifests and
in docker-compose match the CLI (no drift). Every worker and the jobs role serve Prometheus metrics
that a NetworkPolicy lets Prometheus scrape, the jobs role records history (EVALQ_HISTORY_URL) and
sends alerts from Secrets, the nightly CronJob names its suite, and the monitoring ConfigMaps are the
files of deploy/monitoring."""

from __future__ import annotations

import copy
import json
import re
import runpy
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
KEDA_SCHEMAS = K8S / "schemas" / "keda.sh" / "v1alpha1"
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
                                         "PodDisruptionBudget", "ScaledObject", "ConfigMap"}
    for doc in docs:
        if doc["apiVersion"].startswith("keda.sh/"):
            assert keda_errors(doc) == [], f"{doc['kind']} {doc['metadata']['name']}"
        else:
            kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def keda_errors(doc: dict) -> list[str]:
    """Errors of a keda.sh object against KEDA's CRD schema kept in the repo (strict: unknown fields fail)."""
    import jsonschema

    schema = json.loads((KEDA_SCHEMAS / f"{doc['kind']}.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator.iter_errors(doc)]


def test_the_keda_schema_rejects_what_keda_would():
    """The kept schema can fail: a misspelt field, a number where KEDA wants a string, a missing target."""
    good = next(d for d in render("production") if d["kind"] == "ScaledObject")
    assert keda_errors(good) == []
    typo = copy.deepcopy(good)
    typo["spec"]["minReplicas"] = typo["spec"].pop("minReplicaCount")
    assert any("minReplicas" in e for e in keda_errors(typo))
    number = copy.deepcopy(good)
    number["spec"]["triggers"][0]["metadata"]["targetValue"] = 40
    assert any("targetValue" in e and "string" in e for e in keda_errors(number))
    untargeted = copy.deepcopy(good)
    del untargeted["spec"]["scaleTargetRef"]
    assert any("scaleTargetRef" in e for e in keda_errors(untargeted))
    auth = {"apiVersion": "keda.sh/v1alpha1", "kind": "TriggerAuthentication", "metadata": {"name": "a"},
            "spec": {"secretTargetRef": [{"parameter": "password", "name": "evalq-redis"}]}}
    assert any("key" in e for e in keda_errors(auth))


def test_the_kept_keda_schema_is_what_the_pinned_package_generates():
    pytest.importorskip("cloudcoil.models.keda", reason="the dev extra pins cloudcoil-models-keda")
    generate = runpy.run_path(str(K8S / "schemas" / "generate.py"))
    for kind, schema in generate["schemas"]().items():
        kept = (KEDA_SCHEMAS / f"{kind}.json").read_text()
        assert kept == generate["render"](schema), "regenerate: .venv/bin/python deploy/k8s/schemas/generate.py"


def worker_queues(doc: dict) -> list[str]:
    args = doc["spec"]["template"]["spec"]["containers"][0]["args"]
    return args[args.index("--queues") + 1].split(",")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_keda_objects_scale_existing_workers_on_their_own_queues(overlay):
    docs = render(overlay)
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
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
        namespace = s["metadata"].get("namespace", "evalq")
        for trigger in spec["triggers"]:
            # the queue's backlog, served by the jobs role: a window is all its Redis list holds
            assert trigger["type"] == "metrics-api" and "authenticationRef" not in trigger
            meta = trigger["metadata"]
            assert set(meta) == {"url", "valueLocation", "format", "targetValue"}
            assert all(isinstance(v, str) for v in meta.values())  # KEDA metadata values are strings
            assert int(meta["targetValue"]) > 0 and meta["valueLocation"] == "backlog" and meta["format"] == "json"
            prefix = f"http://evalq-jobs.{namespace}.svc.cluster.local:9808/backlog/"
            assert meta["url"].startswith(prefix), meta["url"]  # the Service in the objects' own namespace
            assert meta["url"][len(prefix):] in worker_queues(target)  # scales on a queue the worker consumes
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    assert services["evalq-jobs"]["spec"]["ports"][0]["port"] == 9808
    config = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "evalq-config")
    assert config["data"]["EVALQ_BACKLOG_PORT"] == "9808" and config["data"]["EVALQ_BACKLOG_HOST"] == "0.0.0.0"
    gpu = next(s for s in scaled if s["spec"]["scaleTargetRef"]["name"] == "evalq-worker-gpu")
    assert gpu["spec"]["minReplicaCount"] == 0  # to zero when idle


def cli_accepts(args: list[str]) -> None:
    """Parse a container's evalq arguments with the real CLI (click), without running it."""
    from evalq.cli import cli

    command = cli.commands[args[0]]
    command.make_context(args[0], list(args[1:]))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_manifests_match_the_cli_and_its_settings(overlay):
    docs = render(overlay)
    readme = (ROOT / "docs" / "reference" / "configuration.md").read_text()  # every setting's reference
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
    evalq_services = {name: s for name, s in compose["services"].items() if s.get("image", "").startswith("evalq")}
    assert {"jobs", "worker-cpu", "worker-gpu", "worker-judge", "flower"} <= set(evalq_services)
    for name, service in evalq_services.items():  # redis, postgres, prometheus run their own images
        command = [c for c in service["command"]]
        cli_accepts([c.replace("${EVALQ_JUDGE_QUEUES:-", "").rstrip("}") for c in command])


# --- metrics, history and the nightly suite (issue 23) ---

def pod_of(doc: dict) -> dict:
    """The pod template (metadata and spec) of a Deployment, StatefulSet or CronJob."""
    return doc["spec"]["jobTemplate"]["spec"]["template"] if doc["kind"] == "CronJob" else doc["spec"]["template"]


def selects(selector: dict, labels: dict) -> bool:
    assert set(selector) <= {"matchLabels"}, selector  # matchExpressions are not used here
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def evalq_workers(docs: list[dict]) -> dict[str, dict]:
    """Deployments that run `evalq worker` (the jobs role included)."""
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"
            and pod_of(d)["spec"]["containers"][0]["args"][0] == "worker"}


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_worker_serves_metrics_that_prometheus_may_scrape(overlay):
    docs = render(overlay)
    workers = evalq_workers(docs)
    assert set(workers) == {"evalq-jobs", "evalq-worker-cpu", "evalq-worker-gpu", "evalq-worker-judge"}
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    for name, doc in workers.items():
        pod = pod_of(doc)
        container = pod["spec"]["containers"][0]
        port = int(env_of(container)["EVALQ_METRICS_PORT"]["value"])
        assert 1024 < port < 65536 and port != 9808, name  # not the backlog endpoint's port
        assert {"name": "metrics", "containerPort": port, "protocol": "TCP"} in container["ports"], name
        annotations = pod["metadata"].get("annotations", {})
        assert annotations.get("prometheus.io/scrape") == "true", name
        assert annotations.get("prometheus.io/port") == str(port), name
        assert annotations.get("prometheus.io/path") == "/metrics", name
        # once any policy selects a pod for ingress, only what some policy allows gets in
        ingress = [p for p in policies if "Ingress" in p["spec"]["policyTypes"]
                   and selects(p["spec"]["podSelector"], pod["metadata"]["labels"])]
        assert ingress, f"{name}: no ingress policy: Prometheus is not the only one that may scrape it"
        allowed = [rule for p in ingress for rule in p["spec"].get("ingress", [])
                   if any(str(q["port"]) in ("metrics", str(port)) for q in rule.get("ports", []))]
        assert allowed, f"{name}: no NetworkPolicy lets Prometheus reach port {port}"
        assert all(src.get("namespaceSelector") for rule in allowed for src in rule["from"]), name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_jobs_role_records_history_and_sends_alerts_from_secrets(overlay):
    docs = render(overlay)
    jobs = pod_of(evalq_workers(docs)["evalq-jobs"])
    env = env_of(jobs["spec"]["containers"][0])
    # required: the final callback runs on either replica, both must write one store (not a pod's SQLite)
    assert env["EVALQ_HISTORY_URL"]["valueFrom"] == {"secretKeyRef": {"name": "evalq-history", "key": "url"}}
    assert env["EVALQ_ALERT_WEBHOOK"]["valueFrom"] == {
        "secretKeyRef": {"name": "evalq-alert-webhook", "key": "url", "optional": True}}
    for name, doc in evalq_workers(docs).items():  # the store and the webhook belong to the jobs role only
        if name != "evalq-jobs":
            assert not {"EVALQ_HISTORY_URL", "EVALQ_ALERT_WEBHOOK"} & set(env_of(pod_of(doc)["spec"]["containers"][0]))
    egress = [rule for d in docs if d["kind"] == "NetworkPolicy" and "Egress" in d["spec"]["policyTypes"]
              and selects(d["spec"]["podSelector"], jobs["metadata"]["labels"]) for rule in d["spec"]["egress"]]
    assert any({"port": 5432, "protocol": "TCP"} in rule.get("ports", []) for rule in egress)
    postgres = [d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "evalq-postgres"]
    if overlay == "production":
        assert postgres == []  # an external database, named by the Secret
        return
    (db,) = postgres
    container = pod_of(db)["spec"]["containers"][0]
    assert container["image"].startswith("postgres:")
    assert env_of(container)["POSTGRES_PASSWORD"]["valueFrom"] == {
        "secretKeyRef": {"name": "evalq-history", "key": "password"}}
    service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "evalq-postgres")
    assert selects({"matchLabels": service["spec"]["selector"]}, pod_of(db)["metadata"]["labels"])
    assert service["spec"]["ports"][0]["port"] == 5432
    assert db["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] in {
        m["name"] for m in container["volumeMounts"]}
    # only the jobs role reaches the database
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy" and "Ingress" in d["spec"]["policyTypes"]
                 and selects(d["spec"]["podSelector"], pod_of(db)["metadata"]["labels"])]
    sources = [src for rule in policy["spec"]["ingress"] for src in rule["from"]]
    assert sources and all(selects(src["podSelector"], jobs["metadata"]["labels"]) for src in sources)
    # the URL the Secret's comment tells operators to write names this Service
    assert "@evalq-postgres:5432/" in (K8S / "overlays" / "dev" / "postgres.yaml").read_text()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_nightly_cronjob_sends_a_suite_the_nightly_alert_watches(overlay):
    docs = render(overlay)
    (cron,) = [d for d in docs if d["kind"] == "CronJob" and d["metadata"]["name"] == "evalq-nightly"]
    pod = pod_of(cron)["spec"]
    script = " ".join(pod["containers"][0]["args"])
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if script.count(m["mountPath"] + "/"))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    config = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == volume["configMap"]["name"])
    job_file = re.search(re.escape(mount["mountPath"]) + r"/(\S+)", script).group(1)
    job = json.loads(config["data"][job_file])
    assert isinstance(job.get("suite"), str) and job["suite"].strip(), "the nightly job names no suite"
    from evalq.shared.job.schema import JOB_KEYS
    from evalq.shared.job.nightly import suite_problem

    assert set(job) <= JOB_KEYS and suite_problem(job["suite"]) is None  # what `evalq submit` accepts
    rules = yaml.safe_load((ROOT / "deploy" / "monitoring" / "rules.yml").read_text())
    (missed,) = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "EvalqNightlyMissed"]
    pattern = re.search(r'suite=~"([^"]+)"', missed["expr"]).group(1)
    assert re.fullmatch(pattern, job["suite"]), (pattern, job["suite"])  # PromQL regexes are anchored


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_alert_rules_and_dashboard_ship_as_configmaps_of_the_monitoring_files(overlay):
    docs = render(overlay)
    maps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    monitoring = ROOT / "deploy" / "monitoring"
    assert maps["evalq-prometheus-rules"]["data"] == {"evalq.rules.yml": (monitoring / "rules.yml").read_text()}
    dashboard = maps["evalq-grafana-dashboard"]
    assert dashboard["data"] == {"evalq.json": (monitoring / "dashboard.json").read_text()}
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"  # Grafana's sidecar picks it up
    assert not [d for d in docs if d["apiVersion"].startswith("monitoring.coreos.com/")]  # annotations only


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_tenant_acl_cronjob_runs_the_cli_command_that_makes_the_users(overlay):
    """Tenants' Redis ACL users (README "Tenant identity") are applied by `evalq tenants acl --apply`,
    with each tenant's password from an optional Secret; suspended until the operator lists tenants."""
    docs = render(overlay)
    (cron,) = [d for d in docs if d["kind"] == "CronJob" and d["metadata"]["name"] == "evalq-tenant-acl"]
    container = pod_of(cron)["spec"]["containers"][0]
    assert container["args"] == ["tenants", "acl", "--apply"] and cron["spec"]["suspend"] is True
    from evalq.cli import cli

    cli.commands["tenants"].commands["acl"].make_context("acl", ["--apply"])
    assert {"secretRef": {"name": "evalq-tenant-passwords", "optional": True}} in container["envFrom"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_monitoring_cronjob_scores_yesterdays_traces_with_a_valid_job(overlay, monkeypatch):
    """Issue 41: the CronJob's job file, with yesterday's date written in as its shell does, is a valid
    trace-dataset job (read against the example export), its suite is watched by the nightly alert,
    and it reads the two last days' partitions (a brace the reader expands)."""
    from evalq.shared.data.traces import expand_braces
    from evalq.shared.job.schema import parse_job

    docs = render(overlay)
    (cron,) = [d for d in docs if d["kind"] == "CronJob" and d["metadata"]["name"] == "evalq-monitoring"]
    script = " ".join(pod_of(cron)["spec"]["containers"][0]["args"])
    config = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "evalq-monitoring")
    text = config["data"]["job.json"]
    assert "@DAY@" in text and 's#@DAY@#{$(date -u -d yesterday +%Y/%m/%d),$(date -u +%Y/%m/%d)}#' in script
    job = json.loads(text.replace("@DAY@", "{2026/11/25,2026/11/26}"))
    assert expand_braces(job["dataset"]["uri"]) == ["s3://acme-otel/traces/2026/11/25/**",
                                                    "s3://acme-otel/traces/2026/11/26/**"]
    rules = yaml.safe_load((ROOT / "deploy" / "monitoring" / "rules.yml").read_text())
    (missed,) = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "EvalqNightlyMissed"]
    assert re.fullmatch(re.search(r'suite=~"([^"]+)"', missed["expr"]).group(1), job["suite"])
    monkeypatch.setenv("EVALQ_CATALOGUE", str(ROOT / "deploy" / "catalogue.json"))
    monkeypatch.delenv("EVALQ_ENDPOINTS", raising=False)
    job["dataset"]["uri"] = str(ROOT / "examples" / "data" / "otel_traces.jsonl")
    assert job["dataset"]["traces"].pop("since") == "-48h"  # the example export is older than two days
    assert job["dataset"]["traces"].pop("sample_rate") == 0.05  # its 8 instances might all be left out
    assert len(parse_job(job, source="monitoring", keys_needed=False).instances) == 8
    prefixes = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "evalq-config")
    assert "s3://acme-otel/traces/" in prefixes["data"]["EVALQ_S3_PREFIXES"]


def test_dev_keeps_its_jobs_in_a_store_every_worker_mounts():
    """Issue 72: the dev overlay sets a store too, a volume every evalq worker mounts at the path
    EVALQ_STORE names (one claim: the pods of a one-node cluster share it)."""
    docs = render("dev")
    (config,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "evalq-config"]
    path = config["data"]["EVALQ_STORE"]
    assert path.startswith("/")
    (claim,) = [d for d in docs if d["kind"] == "PersistentVolumeClaim" and d["metadata"]["name"] == "evalq-store"]
    for name, doc in evalq_workers(docs).items():
        spec = pod_of(doc)["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0].get("volumeMounts", [])}
        assert path in mounts, name
        assert volumes[mounts[path]]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"], name
        assert {"configMapRef": {"name": "evalq-config"}} in spec["containers"][0]["envFrom"], name


def test_production_keeps_its_jobs_in_a_store_every_worker_reaches():
    """Issue 72: with a job store a night whose Redis is lost is rebuilt from it; production sets one
    (on S3), every evalq worker reads it from evalq-config and may reach S3 on 443."""
    docs = render("production")
    (config,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "evalq-config"]
    assert config["data"]["EVALQ_STORE"].startswith("s3://")
    egress = [d for d in docs if d["kind"] == "NetworkPolicy" and "Egress" in d["spec"]["policyTypes"]]
    for name, doc in evalq_workers(docs).items():
        pod = pod_of(doc)
        assert {"configMapRef": {"name": "evalq-config"}} in pod["spec"]["containers"][0]["envFrom"], name
        rules = [rule for d in egress if selects(d["spec"]["podSelector"], pod["metadata"]["labels"])
                 for rule in d["spec"]["egress"]]
        assert any({"port": 443, "protocol": "TCP"} in rule.get("ports", []) for rule in rules), name
