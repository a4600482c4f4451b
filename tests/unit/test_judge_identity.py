"""Issue 61: the judge is part of a run's identity. An entry's judge identity is its model, the
versions the provider said answered, its deployments, a digest of what the metric asks (prompt,
rubric, examples, schema) and the sampling settings; the history compares an entry only with runs
judged alike, marks a change of judge as a break with an alert line of its own, never a regression."""

from __future__ import annotations

import json
import pytest

import evalq.shared.job.catalogue  # noqa: F401  (registers the metrics)
from evalq.results.alerts import payload
from evalq.results.history import open_store
from evalq.shared.judging.judges import JudgeConfig, RubricParams, judge_identity
from evalq.shared.metrics.registry import REGISTRY
from evalq.workers.judge.identity import prompt_digest
from tests.unit.test_history import GOOD, SETTINGS, WORSE, run_row, series

JUDGE = {"provider": "openai", "model": "gpt-4o", "api_key_env": "OPENAI_API_KEY",
         "deployments": [{"region": "lab", "tpm": 1000, "rpm": 10}]}


def test_the_identity_changes_with_what_decides_a_verdict_only():
    one = judge_identity(JUDGE, {b"model:gpt-4o-2024-08-06": b"40", b"prompt": b"abc"})
    assert one["versions"] == ["gpt-4o-2024-08-06"] and one["prompt"] == "abc" and one["model"] == "gpt-4o"
    assert judge_identity(JUDGE, {"model:gpt-4o-2024-08-06": "3", "prompt": "abc"})["id"] == one["id"]
    # a provider's silent update behind the alias, a prompt edit, another temperature: another judge
    assert judge_identity(JUDGE, {b"model:gpt-4o-2024-11-20": b"40", b"prompt": b"abc"})["id"] != one["id"]
    assert judge_identity(JUDGE, {b"model:gpt-4o-2024-08-06": b"40", b"prompt": b"abd"})["id"] != one["id"]
    assert judge_identity({**JUDGE, "temperature": 0.7}, {b"model:gpt-4o-2024-08-06": b"1", b"prompt": b"abc"})["id"] \
        != one["id"]
    # budgets are not the judge
    more = {**JUDGE, "deployments": [{"region": "lab", "tpm": 99999, "rpm": 999}]}
    assert judge_identity(more, {b"model:gpt-4o-2024-08-06": b"1", b"prompt": b"abc"})["id"] == one["id"]
    # no digest could be made: the parameters stand for the prompt, a threshold is not the judge
    a = judge_identity(JUDGE, {}, {"judge": "x", "criteria": "is it kind?", "threshold": 3})
    assert a["id"] == judge_identity(JUDGE, {}, {"judge": "y", "criteria": "is it kind?", "threshold": 4})["id"]
    assert a["id"] != judge_identity(JUDGE, {}, {"judge": "x", "criteria": "is it true?"})["id"]


def test_the_prompt_digest_is_what_the_metric_asks_whatever_the_instance():
    spec = REGISTRY.get("rubric")
    judge = JudgeConfig.model_validate(JUDGE)
    base = RubricParams(judge="j", criteria="Is the answer polite?")
    digest = prompt_digest(spec, base, judge)
    assert digest and len(digest) == 64
    assert prompt_digest(spec, RubricParams(judge="other", criteria="Is the answer polite?"), judge) == digest
    assert prompt_digest(spec, RubricParams(judge="j", criteria="Is the answer true?"), judge) != digest
    with_example = RubricParams(judge="j", criteria="Is the answer polite?",
                                examples=[{"score": 5, "output": "Thank you kindly."}])
    assert prompt_digest(spec, with_example, judge) != digest
    hotter = JudgeConfig.model_validate({**JUDGE, "temperature": 0.9})
    assert prompt_digest(spec, base, hotter) != digest
    assert prompt_digest(REGISTRY.get("coherence"), REGISTRY.get("coherence").params(judge="j"), judge)


def entry_of(identity: dict | None, slot: int = 0, name: str = "exact_match") -> dict:
    return {"slot": slot, "metric": name, "name": name, "parameters": json.dumps({}), "n": 40, "n_errors": 0,
            "n_skipped": 0, "calls": 40, "tokens": 4000, "cost": None,
            "judge": json.dumps(identity) if identity else None, "judge_id": identity["id"] if identity else None}


@pytest.fixture
def store(tmp_path):
    return open_store(f"sqlite:///{tmp_path / 'history.sqlite'}")


def test_a_new_judge_is_a_marked_break_with_an_alert_line_never_a_regression(store):
    old = judge_identity(JUDGE, {b"model:gpt-4o-2024-08-06": b"40", b"prompt": b"p1"})
    new = judge_identity(JUDGE, {b"model:gpt-4o-2024-11-20": b"40", b"prompt": b"p1"})
    for day in (1, 2):
        got = store.record(run_row(f"j{day}", day), [entry_of(old)], [series(GOOD)], SETTINGS)
        assert got.regressions == [] and list(got.judge_changes) == []
    # a night scored lower by another judge: a break, not a regression; its alert says which judge
    got = store.record(run_row("j3", 3), [entry_of(new)], [series(WORSE)], SETTINGS)
    assert got.regressions == [] and got.alert == "pending"
    [change] = got.judge_changes
    assert change["before"]["versions"] == ["gpt-4o-2024-08-06"] and change["after"]["versions"] == ["gpt-4o-2024-11-20"]
    text = payload("nightly", "j3", got.regressions, list(got.judge_changes))["text"]
    assert text == ("nightly: exact_match judge changed: gpt-4o (gpt-4o-2024-08-06), prompt p1 -> "
                    "gpt-4o (gpt-4o-2024-11-20), prompt p1 in job j3; not compared with the runs before")
    # the next night with the new judge: compared with j3 only (same judge); no change to mark
    better = store.record(run_row("j4", 4), [entry_of(new)], [series(WORSE)], SETTINGS)
    assert better.regressions == [] and list(better.judge_changes) == [] and better.alert == "none"
    # a redelivered callback reads the same answer back
    again = store.record(run_row("j3", 3), [entry_of(new)], [series(WORSE)], SETTINGS)
    assert not again.new and [c["after"]["id"] for c in again.judge_changes] == [new["id"]]
    runs = store.runs_of("nightly")
    marks = [[m.get("judge_changed", {}).get("after", {}).get("id") for m in r["metrics"]] for r in runs]
    assert marks == [[None], [None], [new["id"]], [None]]
    assert runs[0]["metrics"][0]["judge"]["id"] == old["id"]
    # a worse night with the old judge back: compared with the old judge's runs (j1, j2), a regression
    back = store.record(run_row("j5", 5), [entry_of(old)], [series(WORSE)], SETTINGS)
    [found] = back.regressions
    assert found["baseline_runs"] == 2 and found["baseline"] == pytest.approx(0.8)
    assert [c["after"]["id"] for c in back.judge_changes] == [old["id"]]


def test_runs_an_older_store_kept_without_a_judge_are_compared_with_any(store):
    new = judge_identity(JUDGE, {b"prompt": b"p1"})
    store.record(run_row("j1", 1), [entry_of(None)], [series(GOOD)], SETTINGS)
    got = store.record(run_row("j2", 2), [entry_of(new)], [series(WORSE)], SETTINGS)
    assert [f["name"] for f in got.regressions] == ["exact_match"] and list(got.judge_changes) == []


def test_the_history_page_breaks_the_line_where_the_judge_changed(store):
    from evalq.results.history_page import render

    old = judge_identity(JUDGE, {b"model:gpt-4o-2024-08-06": b"1", b"prompt": b"p1"})
    new = judge_identity(JUDGE, {b"model:gpt-4o-2024-11-20": b"1", b"prompt": b"p1"})
    for day, identity in ((1, old), (2, old), (3, new), (4, new)):
        store.record(run_row(f"j{day}", day), [entry_of(identity)], [series(GOOD)], SETTINGS)
    page = render({"suite": "nightly", "runs": store.runs_of("nightly")})
    assert page.count("class=judge") == 1 and "judge changed in run 3" in page
