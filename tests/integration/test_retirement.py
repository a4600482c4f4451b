"""Judges that retire (issue 75), against judge-sim told a model's shutdown date as OpenAI's and Azure
OpenAI's model lists say it: `evalq validate --ask-providers` warns before a night; a night judged by
a retiring model says so in results.json, report.html's header and on `evalq run`'s stderr."""

from __future__ import annotations

import datetime
import json

import pytest

from evalq.sim import JudgeSim, Region
from tests.conftest import evalq

pytestmark = pytest.mark.integration

KEY_ENV = "TEST_RETIRE_API_KEY"
KEY = "sk-retire-test"


def job(sim: JudgeSim, provider: str = "openai") -> dict:
    where = ({"base_url": sim.base_url("lab")} if provider == "openai"
             else {"endpoint": sim.azure_endpoint("lab"), "deployment": "gpt-5"})
    judge = {"provider": provider, "model": "gpt-5", "api_key_env": KEY_ENV,
             "deployments": [{"region": "lab", "tpm": 100_000, "rpm": 600, **where}]}
    if provider == "azure":
        judge["api_version"] = "2024-10-21"
    return {"instances": [{"id": f"q{i}", "input": f"Question {i}?", "actual-output": f"Answer {i}."} for i in range(6)],
            "judges": {"gpt": judge}, "metrics": [{"id": "coherence", "parameters": {"judge": "gpt"}}]}


def in_days(days: int) -> str:
    return (datetime.datetime.now(datetime.timezone.utc).date() + datetime.timedelta(days=days)).isoformat()


@pytest.mark.parametrize("provider", ["openai", "azure"])
def test_validate_asks_the_provider_and_warns_of_a_judge_retiring_soon(provider, tmp_path):
    with JudgeSim([Region("lab")], api_key=KEY, models=["gpt-5"], shutdown={"gpt-5": in_days(12)}) as sim:
        path = tmp_path / "job.json"
        path.write_text(json.dumps(job(sim, provider)))
        soon = evalq("validate", str(path), "--ask-providers", env={KEY_ENV: KEY})
        sim.shutdown["gpt-5"] = in_days(45)  # beyond the 30 days warned of
        later = evalq("validate", str(path), "--ask-providers", env={KEY_ENV: KEY})
        plain = evalq("validate", str(path), env={KEY_ENV: KEY})  # asks nobody
    assert soon.returncode == 0, soon.stderr
    assert (f"warning: judge 'gpt' (gpt-5, region lab): retires on {in_days(12)}, in 12 days: switch judges before "
            "then") in soon.stderr
    assert later.returncode == 0 and "warning" not in later.stderr
    assert "no judge retires within 30 days by what its provider says" in later.stdout
    assert "retires" not in plain.stderr + plain.stdout and "Traceback" not in soon.stderr + later.stderr


def test_a_night_judged_by_a_retiring_model_says_so(tmp_path):
    with JudgeSim([Region("lab")], api_key=KEY, models=["gpt-5"], shutdown={"gpt-5": in_days(5)}) as sim:
        path = tmp_path / "job.json"
        path.write_text(json.dumps(job(sim)))
        ran = evalq("run", str(path), "--out", str(tmp_path / "out"), "-q", env={KEY_ENV: KEY})
    assert ran.returncode == 0, ran.stderr
    [entry] = json.loads((tmp_path / "out" / "results.json").read_text())
    assert entry["judge"]["retires"] == [{"judge": "gpt", "model": "gpt-5", "region": "lab", "date": in_days(5),
                                          "days": 5}]
    line = f"judge &#x27;gpt&#x27; (gpt-5, region lab): retires on {in_days(5)}, in 5 days"
    assert f"<th>judges retiring</th><td>{line}" in (tmp_path / "out" / "report.html").read_text()
    assert f"evalq: warning: judge 'gpt' (gpt-5, region lab): retires on {in_days(5)}, in 5 days" in ran.stderr
