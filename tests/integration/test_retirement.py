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


def test_a_migration_measures_the_new_judge_against_the_old_one_and_people(tmp_path):
    """Before switching judges: both score a calibration sample side by side (the graded items first).
    judge-sim's new model is a point more lenient: on items whose marker says N, the old judge gives N
    and the new min(5, N + 1). The agreement between them is counted here from the markers, and the
    panel's alpha is the krippendorff package's on the same table."""
    import krippendorff
    import numpy as np

    from evalq.sim.pairwise import Biases

    marks = [1 + (i * 3) % 5 for i in range(40)]
    instances = [{"id": f"q{i}", "input": f"Question {i}?", "actual-output": f"Answer {i}. [[sim:score={n}]]",
                  "expected-output": [f"Answer {i}."], **({"human": {"coherence": n}} if i % 4 == 0 else {})}
                 for i, n in enumerate(marks)]
    with JudgeSim([Region("lab")], api_key=KEY, models=["old-judge", "new-judge"],
                  biases={"new-judge": Biases(leniency=1)}) as sim:
        judges = {name: {"provider": "openai", "model": f"{name}-judge", "api_key_env": KEY_ENV,
                         "deployments": [{"region": "lab", "base_url": sim.base_url("lab"), "tpm": 10**6, "rpm": 10**4}]}
                  for name in ("old", "new")}
        path = tmp_path / "nightly.json"
        path.write_text(json.dumps({"instances": instances, "judges": judges, "judging": {"cache": False},
                                    "metrics": [{"id": "coherence", "parameters": {"judge": "old"}},
                                                {"id": "exact_match"}]}))
        env = {KEY_ENV: KEY, "EVALQ_CACHE_DIR": str(tmp_path / "cache")}  # a history store of its own
        ran = evalq("migrate-judge", str(path), "--from", "old", "--to", "new", "--sample", "30",
                    "--out", str(tmp_path / "migration"), "-q", env=env)
        assert ran.returncode == 0, ran.stderr
        # the suite switches judges: a night with the old, then one with the new; the break carries the measure
        nights = []
        for name in ("old", "new"):
            doc = json.loads(path.read_text())
            doc["instances"], doc["metrics"][0]["parameters"]["judge"] = instances[:8], name
            path.write_text(json.dumps(doc))
            nights.append(evalq("run", str(path), "--out", str(tmp_path / f"night-{name}"), "-q", env=env))
            assert nights[-1].returncode == 0, nights[-1].stderr
        shown = evalq("history", "nightly", "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    change = json.loads(shown.stdout)["runs"][-1]["metrics"][0]["judge_changed"]
    measured = change["migration"]
    assert (measured["from"], measured["to"], measured["n"]) == ("old", "new", 30)
    assert measured["agreement"] == json.loads((tmp_path / "migration" / "migration.json").read_text())["entries"][0][
        "agreement"]
    text = evalq("history", "nightly", env=env).stdout
    assert "JUDGE CHANGED" in text and "measured before the switch (evalq migrate-judge" in text
    assert f"new against old on 30 items, exact {measured['agreement']['exact']:.2f}, within one 1.00" in text
    [row] = json.loads((tmp_path / "migration" / "migration.json").read_text())["entries"]
    log = [json.loads(line) for line in (tmp_path / "migration" / "log.jsonl").read_text().splitlines()]
    picked = [int(line["instance_id"][1:]) for line in log]
    assert len(picked) == 30 and {i for i in range(40) if i % 4 == 0} <= set(picked)  # the graded items first
    old = [marks[i] for i in picked]
    new = [min(5, n + 1) for n in old]
    assert row["n"] == 30 and row["means"] == {"old": pytest.approx(np.mean(old)), "new": pytest.approx(np.mean(new))}
    agreement = row["agreement"]
    assert agreement["exact"] == pytest.approx(sum(a == b for a, b in zip(old, new)) / 30)
    assert agreement["within_1"] == 1.0
    assert agreement["alpha"] == pytest.approx(krippendorff.alpha(reliability_data=np.array([old, new], dtype=float),
                                                                  level_of_measurement="ordinal"), abs=1e-9)
    graded = [i for i in picked if i % 4 == 0]
    people = row["with_people"]
    assert people["old"]["n"] == len(graded) and people["old"]["exact"] == 1.0  # the old judge gave the grades
    assert people["new"]["exact"] == pytest.approx(sum(marks[i] == 5 for i in graded) / len(graded))
    assert f"coherence: 30 items; mean old {np.mean(old):.3f}, new {np.mean(new):.3f}" in ran.stdout
