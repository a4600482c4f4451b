"""evalq plan against a hand computation on a job whose numbers are known."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from evalq.cli.capacity import plan_job
from evalq.shared.job.schema import parse_job

ROOT = Path(__file__).resolve().parents[2]
N = 1000
JUDGE = {"provider": "openai", "model": "m", "api_key_env": "TEST_UNIT_API_KEY", "max_tokens": 300,
         "deployments": [{"region": "a", "base_url": "http://127.0.0.1:9/v1", "tpm": 60000, "rpm": 600},
                         {"region": "b", "base_url": "http://127.0.0.1:9/v1", "tpm": 40000, "rpm": 400}]}
JOB = {"instances": [{"id": f"i{k}", "input": "How long is the trail?", "actual-output": "About twelve miles.",
                      "expected-output": ["Twelve miles."]} for k in range(N)],
       "judges": {"j": JUDGE},
       "metrics": [{"id": "bleu"}, {"id": "rouge"}, {"id": "coherence", "parameters": {"judge": "j"}}]}


def test_plan_against_a_hand_computation():
    from evalq.shared.judging.judges import JudgeParams
    from evalq.shared.judging.tokens import estimate_prompt_tokens
    from evalq.workers.metrics import quality

    plan = plan_job(parse_job(JOB), window_s=6 * 3600)
    cpu = next(q for q in plan["queues"] if q["queue"] == "cpu")
    assert cpu["items"] == 2 * N and cpu["seconds_one_worker"] == pytest.approx(2 * N / 7250) and cpu["workers"] == 1
    # the one call coherence makes per item: what the budget reserves for it
    messages = quality.prompt(
        "Rate COHERENCE: do the sentences of the ANSWER fit together and read naturally as a whole?\n"
        + quality.scale("coherence"), [("QUESTION", "How long is the trail?"), ("ANSWER", "About twelve miles.")])
    per_call = estimate_prompt_tokens(messages, json.dumps(quality.rating_schema(1, 5))) + 300
    judge = plan["endpoints"][0]
    assert judge["calls"] == pytest.approx(N) and judge["tokens"] == pytest.approx(N * per_call)
    assert judge["minutes_at_tpm"] == pytest.approx(N * per_call / 100_000)
    assert judge["minutes_at_rpm"] == pytest.approx(N / 1000)
    assert judge["limited_by"] == "tpm" and judge["seconds"] == pytest.approx(60 * N * per_call / 100_000)
    # calls per second x 1 s per call / 16 threads
    assert judge["workers"] == max(1, math.ceil(N / judge["seconds"] / 16))
    assert plan["binding"]["constraint"] == "j's TPM" and plan["binding"]["fits_window"]


def test_a_window_too_short_for_the_tpm_is_said_and_more_cpu_work_needs_more_workers():
    job = parse_job({**JOB, "metrics": JOB["metrics"] + [{"id": "f1_score"}, {"id": "exact_match"}]})
    plan = plan_job(job, window_s=60, cpu_items_per_s=10)
    cpu = next(q for q in plan["queues"] if q["queue"] == "cpu")
    assert cpu["workers"] == math.ceil(4 * N / 10 / 60)
    judge = plan["endpoints"][0]
    assert plan["binding"]["constraint"] == "j's TPM" and not plan["binding"]["fits_window"]
    assert judge["seconds"] > 60


def test_the_cli(tmp_path):
    path = tmp_path / "job.json"
    path.write_text(json.dumps(JOB))
    out = subprocess.run([sys.executable, "-m", "evalq.cli", "plan", str(path), "--window", "30s",
                          "--json"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["window_s"] == 30 and plan["binding"]["fits_window"] is False
    text = subprocess.run([sys.executable, "-m", "evalq.cli", "plan", str(path), "--window", "6h"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert text.returncode == 0 and "binding constraint: j's TPM" in text.stdout
    bad = subprocess.run([sys.executable, "-m", "evalq.cli", "plan", str(path), "--window", "soon"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_a_plan_reads_no_secret(tmp_path):
    """Before: `evalq plan examples/rag_qa.json` on a laptop without DEMO_JUDGE_API_KEY was exit 2.
    A plan (and `validate --offline`) needs the key variable named, not set, and says which are not set."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "DEMO_JUDGE_API_KEY"}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "evalq.cli", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=120)

    plan = cli("plan", "examples/rag_qa.json")
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout.splitlines()[-1] == ("keys: named, not read: DEMO_JUDGE_API_KEY (judges.sim.api_key_env); "
                                            "not set here: DEMO_JUDGE_API_KEY (the workers that call the endpoints "
                                            "need them)")
    as_json = json.loads(cli("plan", "examples/rag_qa.json", "--json").stdout)
    assert as_json["keys"] == [{"variable": "DEMO_JUDGE_API_KEY", "where": "judges.sim.api_key_env", "set": False}]
    assert as_json["endpoints"][0]["calls"] > 0  # the judge's calls are planned all the same
    offline = cli("validate", "--offline", "examples/rag_qa.json")
    assert offline.returncode == 0 and "not set here: DEMO_JUDGE_API_KEY" in offline.stdout, offline.stderr
    online = cli("validate", "examples/rag_qa.json")  # running it needs the key: still a located error
    assert online.returncode == 2 and "judges.sim.api_key_env: environment variable DEMO_JUDGE_API_KEY is not set" \
        in online.stderr and "Traceback" not in online.stderr
    # a judge that names no key variable is not planned: the field is required
    job = json.loads((ROOT / "examples/rag_qa.json").read_text())
    del job["judges"]["sim"]["api_key_env"]
    (tmp_path / "nokey.json").write_text(json.dumps(job))
    nameless = cli("plan", str(tmp_path / "nokey.json"))
    assert nameless.returncode == 2 and "judges.sim.api_key_env" in nameless.stderr, nameless.stderr
    with_key = subprocess.run([sys.executable, "-m", "evalq.cli", "plan", "examples/rag_qa.json", "--json"], cwd=ROOT,
                              env={**env, "DEMO_JUDGE_API_KEY": "k"}, capture_output=True, text=True, timeout=120)
    assert json.loads(with_key.stdout)["keys"][0]["set"] is True
