"""The operator's catalogue of deployments (evalq.shared.judging.deployments): what a job may name and
ask, checked where it is validated, and taken again from the worker's own catalogue where it runs
(the stored spec is not trusted). The cluster path is tests/integration/test_catalogue.py."""

from __future__ import annotations

import json
import uuid
import subprocess
import sys
from pathlib import Path

import pytest

from evalq.shared.judging.deployments import CATALOGUE_ENV, INLINE_ENV, govern, load
from evalq.shared.core.errors import JobError
from evalq.shared.job.schema import parse_job
from evalq.shared.judging.judges import JudgeConfig, deployment_id

ROOT = Path(__file__).resolve().parents[2]
LAB = {"region": "lab", "base_url": "http://127.0.0.1:9/v1", "tpm": 100_000, "rpm": 1_000, "burst_seconds": 5,
       "price": {"input_per_1k": 0.001, "output_per_1k": 0.002}, "batch": {"enqueued_tokens": 1_000_000}}


@pytest.fixture
def catalogue(tmp_path, monkeypatch):
    path = tmp_path / "catalogue.json"
    path.write_text(json.dumps({"deployments": {"lab": LAB, "eu": {**LAB, "region": "eu"}}, "inline": "deny"}))
    monkeypatch.setenv(CATALOGUE_ENV, str(path))
    monkeypatch.delenv(INLINE_ENV, raising=False)
    monkeypatch.delenv("EVALQ_CLUSTER_WORKER", raising=False)
    return path


def job(*deployments, price=None) -> dict:
    judge = {"provider": "openai", "model": "m", "api_key_env": "TEST_UNIT_API_KEY", "deployments": list(deployments)}
    if price:
        judge["price"] = price
    return {"instances": [{"id": "1", "input": "q", "actual-output": "a", "context": "c"}], "judges": {"j": judge},
            "metrics": [{"id": "coherence", "parameters": {"judge": "j"}}]}


def problems(raw: dict) -> list[str]:
    with pytest.raises(JobError) as exc:
        parse_job(raw)
    return exc.value.problems


def test_a_job_names_a_catalogue_deployment_and_may_ask_for_less(catalogue):
    parsed = parse_job(job({"use": "lab"}, {"use": "eu", "tpm": 20_000}))
    lab, eu = parsed.judges["j"].deployments
    assert (lab.use, lab.region, lab.base_url, lab.tpm, lab.rpm, lab.burst_seconds) == \
        ("lab", "lab", LAB["base_url"], 100_000, 1_000, 5)
    assert lab.price.input_per_1k == 0.001 and lab.batch.enqueued_tokens == 1_000_000
    assert (eu.use, eu.tpm, eu.rpm) == ("eu", 20_000, 1_000)
    assert deployment_id(parsed.judges["j"], lab) == "catalogue-lab"


def test_a_job_may_not_ask_for_more_nor_set_what_the_operator_owns(catalogue):
    found = problems(job({"use": "lab", "tpm": 10**8, "window_seconds": 3600, "burst_seconds": 3600,
                          "price": {"input_per_1k": 0, "output_per_1k": 0}, "batch": {"enqueued_tokens": 10**9}}))
    text = "\n".join(found)
    assert "judges.j.deployments[0].tpm: 100000000 is more than the 100000" in text
    for field in ("window_seconds", "burst_seconds", "price", "batch"):
        assert f"judges.j.deployments[0].{field}: set by the operator's catalogue for 'lab'" in text
    assert "judges.j.deployments[0].use: no deployment 'labb' in the operator's catalogue; did you mean 'lab'?" in \
        "\n".join(problems(job({"use": "labb"})))


def test_inline_deployments_follow_the_operators_policy(catalogue, monkeypatch):
    inline = {"region": "lab", "base_url": "http://127.0.0.1:9/v1", "tpm": 10**8, "rpm": 10**6}
    assert "deployments declared by a job are not allowed here (EVALQ_INLINE_DEPLOYMENTS=deny)" in \
        "\n".join(problems(job(inline)))
    monkeypatch.setenv(INLINE_ENV, "own")
    assert parse_job(job(inline)).judges["j"].deployments[0].use is None
    monkeypatch.delenv(CATALOGUE_ENV)
    monkeypatch.delenv(INLINE_ENV)
    parse_job(job(inline))  # no catalogue and no policy: a client (or embedded run) shares, as before
    from evalq.shared.judging.deployments import WORKER_ENV, inline_policy

    assert inline_policy() == "shared"
    monkeypatch.setenv(WORKER_ENV, "1")  # a cluster's worker: keys of the job's own
    assert inline_policy() == "own"
    assert "no catalogue of deployments here (EVALQ_CATALOGUE is not set)" in "\n".join(problems(job({"use": "lab"})))


def test_a_worker_takes_every_number_from_its_own_catalogue(catalogue, monkeypatch):
    """A stored spec forged to name 'lab' with another endpoint, a huge window and TPM: the worker
    runs the catalogue's deployment; a lower TPM the job asked for is its own budget's."""
    forged = JudgeConfig.model_validate(job({**LAB, "use": "lab", "base_url": "http://127.0.0.1:1/evil",
                                             "tpm": 10**8, "window_seconds": 3600, "burst_seconds": 3600,
                                             "price": {"input_per_1k": 0, "output_per_1k": 0},
                                             "batch": {"enqueued_tokens": 10**10}})["judges"]["j"])
    [d] = govern(forged, "J1").deployments
    assert (d.base_url, d.tpm, d.window_seconds, d.burst_seconds, d.price.input_per_1k) == \
        (LAB["base_url"], 100_000, 60, 5, 0.001)
    # the Batch API quota the batch manager holds every job's batches to is the catalogue's too
    assert d.batch.enqueued_tokens == 1_000_000 and deployment_id(forged, d) == "catalogue-lab"
    assert d.own_limit is None  # it asked for more: the catalogue's, and no limit of its own
    lower = JudgeConfig.model_validate(job({**LAB, "use": "lab", "tpm": 5_000})["judges"]["j"])
    [d] = govern(lower, "J1").deployments
    assert d.tpm == 100_000 and d.own_limit == ("J1", 5_000, 1_000)
    gone = JudgeConfig.model_validate(job({**LAB, "use": "elsewhere"})["judges"]["j"])
    with pytest.raises(ValueError, match="not in this worker's catalogue"):
        govern(gone, "J1")
    inline = JudgeConfig.model_validate(job({**LAB})["judges"]["j"])
    with pytest.raises(ValueError, match="allows none"):
        govern(inline, "J1")
    monkeypatch.setenv(INLINE_ENV, "own")
    [own] = govern(inline, "J1").deployments
    assert deployment_id(inline, own) == deployment_id(inline, inline.deployments[0]) + ":job-J1"
    monkeypatch.setenv(INLINE_ENV, "shared")
    [shared] = govern(inline, "J1").deployments
    assert deployment_id(inline, shared) == deployment_id(inline, inline.deployments[0])


def test_a_bad_catalogue_stops_evalq_before_anything_starts(tmp_path):
    path = tmp_path / "catalogue.json"
    path.write_text(json.dumps({"deployments": {"lab": {**LAB, "window_seconds": 10**9}, "x y": LAB},
                                "inline": "maybe"}))
    with pytest.raises(JobError) as exc:
        load(path)
    text = "\n".join(exc.value.problems)
    assert "catalogue.inline" in text and str(path) in text
    path.write_text(json.dumps({"deployments": {"lab": {**LAB, "window_seconds": 10**9}, "x y": LAB}}))
    with pytest.raises(JobError) as exc:
        load(path)
    text = "\n".join(exc.value.problems)
    assert "deployments.lab.window_seconds" in text and "deployments.x y: a name is" in text
    done = subprocess.run([sys.executable, "-m", "evalq.cli", "metrics"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin", CATALOGUE_ENV: str(path)})
    assert done.returncode == 2 and "deployments.lab.window_seconds" in done.stderr and "Traceback" not in done.stderr


def test_a_tenant_cap_is_a_share_of_the_catalogues_tpm_not_of_a_jobs(catalogue, redis_url, monkeypatch):
    """Before: max_share was a share of the TPM the job itself declared: 'ads' capped at 5% escaped
    by declaring tpm 1e9. With a catalogue, the queue's TPM is the operator's for its region."""
    import redis

    from evalq.orchestrator import submit as submitting
    from evalq.orchestrator.pricing import queue_tpm

    monkeypatch.setenv(INLINE_ENV, "own")
    r = redis.Redis.from_url(redis_url)
    inline = {"region": "lab", "base_url": "http://127.0.0.1:9/v1", "tpm": 10**8, "rpm": 10**6}
    parsed = parse_job(job(inline))
    job_id = submitting.store_job(r, parsed, submitting.job_spec(parsed, None, "/tmp/unused"))
    assert queue_tpm(r, "judge.lab", [job_id]) == LAB["tpm"]
    monkeypatch.delenv(CATALOGUE_ENV)
    assert queue_tpm(r, "judge.lab", [job_id]) == 10**8  # no catalogue: as before


def test_a_tenant_cap_on_a_learning_or_adaptive_deployment_is_a_number(tmp_path, redis_url, monkeypatch):
    """Issue 70, item 2: the queue's TPM summed the catalogue's tpm as numbers: "auto" raised
    TypeError and an adaptive deployment (no tpm) KeyError, in every refill, and every job on such a
    deployment waited in line for ever once a tenant had a max_share. A learning deployment counts
    what it has learned (its floor before), per minute; an adaptive one counts no tokens (its
    tenants' shares hold calls in flight)."""
    import redis

    from evalq.orchestrator.pricing import queue_tpm
    from evalq.shared.cluster import keys

    name = f"auto{uuid.uuid4().hex[:6]}"
    path = tmp_path / "catalogue.json"
    path.write_text(json.dumps({"deployments": {
        name: {"region": "mixed", "base_url": "http://127.0.0.1:9/v1", "tpm": "auto", "tpm_floor": 20_000,
               "window_seconds": 10},
        "self": {"region": "mixed", "base_url": "http://127.0.0.1:8/v1"},
        "self-only": {"region": "gpu-box", "base_url": "http://127.0.0.1:8/v1"}}}))
    monkeypatch.setenv(CATALOGUE_ENV, str(path))
    r = redis.Redis.from_url(redis_url)
    assert queue_tpm(r, "judge.mixed", []) == 20_000 * 6  # its floor a window, six windows a minute
    r.hset(keys.budget(f"catalogue-{name}", "learn"), "tpm", 50_000)
    assert queue_tpm(r, "judge.mixed", []) == 50_000 * 6
    assert queue_tpm(r, "judge.gpu-box", []) == 0
