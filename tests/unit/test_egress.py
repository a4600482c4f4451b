"""Where a job's files may be read and written (EVALQ_S3_ENDPOINTS, EVALQ_S3_PREFIXES,
EVALQ_REQUEST_ROOTS), and the smaller holes of the attacker's pass: paths a request's
parameters may probe, passwords in URLs, README examples that must work."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from evalq.shared.policy.egress import S3Policy, job_places, s3_problem
from evalq.shared.core.errors import JobError
from evalq.shared.job.schema import parse_job

ROOT = Path(__file__).resolve().parents[2]


def policy(endpoints=None, prefixes=None, cluster=True) -> S3Policy:
    env = {k: v for k, v in (("EVALQ_S3_ENDPOINTS", endpoints), ("EVALQ_S3_PREFIXES", prefixes)) if v is not None}
    return S3Policy.from_env(env, cluster=cluster)


@pytest.mark.parametrize("uri,endpoint,allowed", [
    ("s3://evals/in/data.jsonl", None, True),
    ("s3://evals/in/sub/data.jsonl", None, True),
    ("s3://evals/input/data.jsonl", None, False),       # a prefix is whole segments
    ("s3://evals/in/../secret", None, False),
    ("s3://evals-x/in/data.jsonl", None, False),
    ("s3://nightly-a/out/run1/results.json", None, True),  # a wildcard bucket
    ("s3://nightly-a/other/results.json", None, False),
    ("s3://evals/in/data.jsonl", "https://minio.internal:9000", True),
    ("s3://evals/in/data.jsonl", "https://minio.internal:9001", False),
    ("s3://evals/in/data.jsonl", "http://169.254.169.254", False),
    ("s3://evals/in/data.jsonl", "https://minio.internal:9000@evil.example", False),
])
def test_places_and_endpoints(uri, endpoint, allowed):
    p = policy("https://minio.internal:9000", "s3://evals/in/, s3://nightly-*/out")
    assert (s3_problem(uri, endpoint, p) is None) is allowed


def test_the_cluster_default_is_aws_only_and_no_bucket():
    p = policy(cluster=True)
    assert "AWS's own endpoints only" in p.endpoint_problem("http://127.0.0.1:9000")
    assert p.endpoint_problem(None) is None
    assert "EVALQ_S3_PREFIXES: none" in p.place_problem("s3://any/key")
    # the evalq command a person runs: the job's own places (read with the person's credentials)
    assert s3_problem("s3://any/key", "http://127.0.0.1:9000", policy(cluster=False)) is None


def test_embedded_mode_lists_exactly_the_jobs_own_places(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"id": 1, "actual-output": "a", "expected-output": ["a"]}\n')
    job = parse_job({"dataset": {"uri": str(data)}, "metrics": [{"id": "exact_match"}],
                     "output": {"uri": "s3://results/nightly/", "endpoint_url": "http://127.0.0.1:9000/"}})
    places = job_places(job)
    p = policy(places["EVALQ_S3_ENDPOINTS"], places["EVALQ_S3_PREFIXES"])
    assert s3_problem("s3://results/nightly/results.json", "http://127.0.0.1:9000", p) is None
    assert s3_problem("s3://results/other/results.json", "http://127.0.0.1:9000", p) is not None
    assert s3_problem("s3://results/nightly/results.json", "http://127.0.0.1:9001", p) is not None


def test_validation_names_the_refused_place(monkeypatch):
    monkeypatch.setenv("EVALQ_S3_ENDPOINTS", "http://127.0.0.1:9000")
    monkeypatch.setenv("EVALQ_S3_PREFIXES", "s3://evals/in/")
    with pytest.raises(JobError) as exc:
        parse_job({"dataset": {"uri": "s3://v2/credentials/role", "format": "jsonl",
                               "endpoint_url": "http://10.0.0.1"},
                   "metrics": [{"id": "exact_match"}], "output": {"uri": "s3://elsewhere/out/"}})
    text = str(exc.value)
    assert "dataset: S3 endpoint http://10.0.0.1 is not one this cluster may use" in text
    assert "output: s3://elsewhere/out/ is not a place this cluster may read or write" in text


@pytest.mark.parametrize("field,value", [("model_type", "/root/.ssh/id_rsa"), ("model_type", "/nonexistent/x"),
                                         ("model_type", "~/models/m"), ("baseline_path", "/etc/passwd"),
                                         ("baseline_path", "/nonexistent.csv")])
def test_a_requests_bertscore_paths_probe_nothing_outside_the_roots(tmp_path, field, value):
    """Before: errors told whether /root/.ssh/id_rsa exists, a file's line count, its first
    byte. Now a request's path outside the roots gets one answer whether it exists or not."""
    params = {field: value}
    if field == "baseline_path":
        params["rescale_with_baseline"] = True
    raw = {"instances": [{"id": 1, "actual-output": "a", "expected-output": ["a"]}],
           "metrics": [{"id": "bertscore", "parameters": params}]}
    with pytest.raises(JobError) as exc:
        parse_job(raw, roots=[tmp_path])
    text = str(exc.value)
    assert "EVALQ_REQUEST_ROOTS" in text and "no such file" not in text and "rows" not in text, text


def test_paths_under_the_roots_are_still_read(tmp_path):
    baseline = tmp_path / "baseline.csv"
    baseline.write_text("LAYER,P,R,F\n" + "".join(f"{i},0.1,0.1,0.1\n" for i in range(7)))
    raw = {"instances": [{"id": 1, "actual-output": "a", "expected-output": ["a"]}],
           "metrics": [{"id": "bertscore", "parameters": {"baseline_path": str(baseline),
                                                          "rescale_with_baseline": True}}]}
    assert parse_job(raw, roots=[tmp_path]).metrics[0].params.baseline_path == str(baseline)


@pytest.mark.parametrize("url,secret", [
    ("redis://:hunter2@redis:6379/0", "hunter2"),
    ("redis://user:hunter2@redis:6379/0", "hunter2"),
    ("redis://redis:6379/0?password=hunter2&db=1", "hunter2"),
    ("rediss://redis:6380/0?ssl_cert_reqs=required&password=hun%40ter2", "hun"),
    ("redis://redis:6379/0?username=admin&password=hunter2", "admin"),
])
def test_safe_url_hides_passwords_wherever_the_url_carries_them(url, secret):
    from evalq.shared.core.config import safe_url

    shown = safe_url(url)
    assert secret not in shown and "***" in shown and "redis" in shown


def test_the_docs_reply_to_examples_are_accepted():
    """Before: the README's own example (reply_to "evalq:replies:nightly") was refused, so a
    client following it waited for ever."""
    from evalq.orchestrator.service import reply_to_problem

    readme = "\n".join(p.read_text() for p in sorted((ROOT / "docs").rglob("*.md")))
    names = re.findall(r'"reply_to":\s*"([^"]+)"', readme) + re.findall(r"BLPOP (\S+)", readme)
    assert names
    for name in names:
        assert reply_to_problem(name) is None, name


def test_a_tenant_reaches_only_its_part_of_each_root_and_prefix(tmp_path):
    """Issue 37: once tenants are listed, a request of tenant T reaches <root>/T and
    s3://<prefix>/T/ (or the place with {tenant} filled in); the operator's shared places are read,
    never written."""
    from evalq.shared.policy.egress import Reach

    env = {"EVALQ_REQUEST_ROOTS": f"{tmp_path}/data:{tmp_path}/teams/{{tenant}}/work",
           "EVALQ_SHARED_ROOTS": f"{tmp_path}/models",
           "EVALQ_S3_PREFIXES": "s3://eval-out/nightly,s3://team-{tenant}/",
           "EVALQ_S3_SHARED_PREFIXES": "s3://eval-data/public/"}
    ads = Reach.of("ads", env)
    for uri in (f"{tmp_path}/data/ads/x", f"{tmp_path}/teams/ads/work/y", "s3://eval-out/nightly/ads/r",
                "s3://team-ads/anything"):
        assert ads.write_problem(uri) is None and ads.read_problem(uri) is None, uri
    for uri in (f"{tmp_path}/data/search/x", f"{tmp_path}/data/x", f"{tmp_path}/data/ads/../search/x",
                f"{tmp_path}/teams/search/work/y", f"{tmp_path}/data/adsx/y", "s3://eval-out/nightly/search/r",
                "s3://eval-out/nightly/r", "s3://team-search/x", "s3://eval-out/nightly/ads/../search/r"):
        assert ads.write_problem(uri) and ads.read_problem(uri), uri
    for uri in (f"{tmp_path}/models/minilm", "s3://eval-data/public/q.jsonl"):  # shared: read, never written
        assert ads.read_problem(uri) is None and ads.write_problem(uri), uri
    assert "tenant 'ads'" in ads.write_problem(f"{tmp_path}/data/search/x")
    # no tenants listed (a single team's cluster): every place the operator lists, as before
    anyone = Reach.of(None, env)
    assert anyone.write_problem(f"{tmp_path}/data/x") is None and anyone.write_problem("s3://eval-out/nightly/r") is None


def test_a_tenants_exporter_takes_only_that_tenants_events(monkeypatch):
    """Before: output.otel picked any of the operator's exporters by name, so with one exporter per
    team a tenant could send its events to another team's collector."""
    from evalq.results.sinks.otlp import endpoint_for
    from evalq.shared.core.config import exporter_problem

    monkeypatch.setenv("EVALQ_OTEL_EXPORTERS", "search:prod=http://127.0.0.1:1/v1/logs;"
                                               "ads:prod=http://127.0.0.1:2/v1/logs;lab=http://127.0.0.1:3/v1/logs")
    assert exporter_problem("search:prod", "search") is None and exporter_problem("lab", "ads") is None
    said = exporter_problem("search:prod", "ads")
    assert said and "tenant 'search''s" in said and "ads:<name>" in said
    assert exporter_problem("search:prod", None) is None  # a cluster without tenants: one team's
    # at export time, from the stored spec's tenant (a spec is not trusted to have been checked)
    spec = {"otel_export": "search:prod", "scheduling": {"tenant": "ads"}}
    assert endpoint_for(spec) is None
    assert endpoint_for({**spec, "scheduling": {"tenant": "search"}}) == "http://127.0.0.1:1/v1/logs"
    assert endpoint_for({"otel_export": "lab", "scheduling": {"tenant": "ads"}}) == "http://127.0.0.1:3/v1/logs"
