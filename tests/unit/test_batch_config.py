"""The Batch API settings (issue #24): ``judging.mode`` and ``judging.deadline``, a judge
metric entry's ``mode``, a deployment's ``batch``; their validation (located problems,
exit 2 at the CLI) and the deadline's arithmetic."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from evalq.shared.judging.batch_config import parse_deadline
from evalq.shared.core.errors import JobError
from evalq.shared.job.schema import parse_job
from evalq.shared.judging.judges import JudgingOptions
from tests.conftest import evalq

KEY_ENV = "TEST_UNIT_API_KEY"  # set by tests/conftest.py
INSTANCE = {"id": "1", "input": "q", "actual-output": "a", "context": "c", "expected-output": ["a"]}
BATCH = {"enqueued_tokens": 50_000_000}
UTC = timezone.utc


def deployment(region: str, batch: dict | None = None, **extra) -> dict:
    return {"region": region, "base_url": "http://127.0.0.1:9/v1", "tpm": 1000, "rpm": 10,
            **({"batch": batch} if batch is not None else {}), **extra}


def judge(*deployments: dict, provider: str = "openai") -> dict:
    return {"provider": provider, "model": "m", "api_key_env": KEY_ENV,
            "deployments": list(deployments) or [deployment("r0")]}


def job(judges: dict, judging: dict | None = None, metrics: list | None = None, **extra) -> dict:
    return {"instances": [INSTANCE], "judges": judges, "judging": judging or {},
            "metrics": metrics or [{"id": "fluency", "parameters": {"judge": "j"}}], **extra}


def problems(raw) -> list[str]:
    with pytest.raises(JobError) as info:
        parse_job(raw, source="job.json")
    return info.value.problems


# --- reading ------------------------------------------------------------------------------

def test_defaults_are_sync_without_a_deadline_and_leave_parameters_as_before():
    parsed = parse_job(job({"j": judge()}))
    assert (parsed.judging.mode, parsed.judging.deadline) == ("sync", None)
    assert parsed.judges["j"].deployments[0].batch is None
    # an entry without its own mode shows the parameters it always showed
    assert parsed.metrics[0].params_json() == {"judge": "j", "threshold": None}


def test_modes_deadline_and_batch_capacity_are_read():
    cfg = judge(deployment("r0"), deployment("r1", {"enqueued_tokens": 5_000}))
    parsed = parse_job(job({"j": cfg}, {"mode": "auto", "deadline": "90m"},
                           [{"id": "fluency", "parameters": {"judge": "j", "mode": "batch"}},
                            {"id": "coherence", "parameters": {"judge": "j"}}]))
    first, second = parsed.metrics
    assert (first.params.mode, first.params.effective_mode(parsed.judging)) == ("batch", "batch")
    assert (second.params.mode, second.params.effective_mode(parsed.judging)) == (None, "auto")
    assert first.params_json() == {"judge": "j", "mode": "batch", "threshold": None}
    judge_cfg = parsed.judges["j"]
    assert [d.region for d in judge_cfg.batch_deployments] == ["r1"]
    capacity = judge_cfg.deployments[1].batch
    assert (capacity.enqueued_tokens, capacity.deployment, capacity.completion_window) == (5_000, None, "24h")


def test_judging_options_survive_the_stored_spec_round_trip():
    """The job spec carries ``judging`` as JSON; workers read it back."""
    options = JudgingOptions.model_validate({"mode": "auto", "deadline": "06:30"})
    stored = json.loads(json.dumps(options.model_dump(mode="json")))
    assert stored["mode"] == "auto" and stored["deadline"] == "06:30"
    assert JudgingOptions.model_validate(stored) == options


def test_the_same_metric_in_two_modes_is_still_computed_twice_over():
    """The path a call takes does not change what it computes."""
    found = problems(job({"j": judge(deployment("r0", BATCH))}, {},
                         [{"id": "fluency", "parameters": {"judge": "j"}},
                          {"id": "fluency", "parameters": {"judge": "j", "mode": "batch"}}]))
    assert any(p.startswith("job.json: metrics[1] (fluency): same metric and parameters as metrics[0]")
               for p in found), found


# --- located problems --------------------------------------------------------------------------

@pytest.mark.parametrize("judging, where, message", [
    ({"mode": "nightly"}, "judging.mode", "'sync', 'batch' or 'auto'"),
    ({"mode": "auto", "deadline": "6 hours"}, "judging.deadline", "neither a duration"),
    ({"mode": "auto", "deadline": "25:00"}, "judging.deadline", "neither a duration"),
    ({"mode": "auto", "deadline": "0h"}, "judging.deadline", "after the submission"),
    ({"mode": "auto", "deadline": "200h"}, "judging.deadline", "at most 7 days"),
    ({"mode": "auto", "deadline": 3600}, "judging.deadline", "expected a string"),
    ({"mode": "auto", "deadlin": "6h"}, "judging.deadlin", "unknown field; did you mean 'deadline'?"),
])
def test_bad_judging_options_are_located(judging, where, message):
    found = problems(job({"j": judge(deployment("r0", BATCH))}, judging))
    assert any(p.startswith(f"job.json: {where}: ") and message in p for p in found), found


@pytest.mark.parametrize("batch, where, message", [
    ({}, "judges.j.deployments.0.batch.enqueued_tokens", "Field required"),
    ({"enqueued_tokens": 0}, "judges.j.deployments.0.batch.enqueued_tokens", "greater than 0"),
    ({"enqueued_tokens": "5"}, "judges.j.deployments.0.batch.enqueued_tokens", "valid integer"),
    ({"enqueued_tokens": 5, "completion_window": "48h"}, "judges.j.deployments.0.batch.completion_window", "24h"),
    ({"enqueued_tokens": 5, "quota": 1}, "judges.j.deployments.0.batch.quota", "unknown field"),
    ({"enqueued_tokens": 5, "deployment": "gb"}, "judges.j", "'batch.deployment' is for provider azure"),
])
def test_a_bad_batch_capacity_is_located(batch, where, message):
    found = problems(job({"j": judge(deployment("r0", batch))}))
    assert any(p.startswith(f"job.json: {where}: ") and message in p for p in found), found


def test_an_azure_deployment_names_its_global_batch_deployment():
    azure = {"provider": "azure", "model": "gpt-4o", "api_key_env": KEY_ENV, "api_version": "2024-10-21",
             "deployments": [{"region": "se", "endpoint": "http://127.0.0.1:9", "deployment": "gpt4o",
                              "tpm": 1000, "rpm": 10, "batch": {"enqueued_tokens": 9, "deployment": "gpt4o-gb"}}]}
    parsed = parse_job(job({"j": azure}, {"mode": "batch"}))
    assert parsed.judges["j"].deployments[0].batch.deployment == "gpt4o-gb"


@pytest.mark.parametrize("mode", ["batch", "auto"])
def test_a_batched_job_on_a_judge_without_batch_names_each_entry_and_the_judge(mode):
    found = problems(job({"j": judge(deployment("r0"), deployment("r1")), "k": judge(deployment("x", BATCH))},
                         {"mode": mode},
                         [{"id": "fluency", "parameters": {"judge": "j"}},
                          {"id": "coherence", "parameters": {"judge": "k"}},
                          {"id": "violence", "parameters": {"judge": "j"}}]))
    assert found == [
        f"job.json: metrics[0] (fluency): mode '{mode}' (judging.mode) needs a batch-capable deployment, and "
        "none of judge 'j''s deployments (r0, r1) declares 'batch' (e.g. \"batch\": {\"enqueued_tokens\": 50000000})",
        f"job.json: metrics[2] (violence): mode '{mode}' (judging.mode) needs a batch-capable deployment, and "
        "none of judge 'j''s deployments (r0, r1) declares 'batch' (e.g. \"batch\": {\"enqueued_tokens\": 50000000})"]


def test_an_entry_asking_for_batch_is_located_at_its_mode_and_sync_entries_pass():
    found = problems(job({"j": judge()}, {}, [{"id": "fluency", "parameters": {"judge": "j", "mode": "auto"}},
                                              {"id": "coherence", "parameters": {"judge": "j"}}]))
    assert len(found) == 1 and found[0].startswith(
        "job.json: metrics[0] (fluency).parameters.mode: mode 'auto' needs a batch-capable deployment"), found
    # an entry may also opt out of a batch job: sync on a judge without batch passes
    parsed = parse_job(job({"j": judge()}, {"mode": "batch"},
                           [{"id": "fluency", "parameters": {"judge": "j", "mode": "sync"}}]))
    assert parsed.metrics[0].params.effective_mode(parsed.judging) == "sync"


def test_a_bad_entry_mode_is_a_parameter_problem():
    found = problems(job({"j": judge()}, {}, [{"id": "fluency", "parameters": {"judge": "j", "mode": "later"}}]))
    assert any(p.startswith("job.json: metrics[0] (fluency).parameters: mode: Input should be 'sync', 'batch' "
                            "or 'auto'") for p in found), found


def model(batch: dict | None = None) -> dict:
    return {**judge(deployment("gen", batch)), "prompt_template": "$model_input"}


def test_generation_through_an_endpoint_model_needs_batch_in_batch_mode():
    generating = {"instances": [{"id": "1", "input": "q", "expected-output": ["a"]}], "model": model(),
                  "metrics": [{"id": "exact_match"}]}
    assert problems({**generating, "judging": {"mode": "batch"}}) == [
        "job.json: model: judging.mode 'batch' also generates through the Batch API, and none of the model's "
        "deployments (gen) declares 'batch'"]
    parse_job({**generating, "judging": {"mode": "auto"}})   # auto: a model without batch generates synchronously
    parse_job({**generating, "judging": {"mode": "batch"}, "model": model(BATCH)})


def test_a_batch_problem_exits_2_at_the_cli(tmp_path):
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job({"j": judge()}, {"mode": "batch"})))
    proc = evalq("validate", str(path))
    assert proc.returncode == 2, proc.stderr
    assert "metrics[0] (fluency): mode 'batch'" in proc.stderr and "judge 'j'" in proc.stderr
    assert "Traceback" not in proc.stderr


# --- the deadline -----------------------------------------------------------------------------------

@pytest.mark.parametrize("text, after", [
    ("6h", timedelta(hours=6)), ("90m", timedelta(minutes=90)), ("3600s", timedelta(hours=1)),
    ("1h30m", timedelta(minutes=90)), ("2h0m15s", timedelta(hours=2, seconds=15)), (" 45M ", timedelta(minutes=45)),
])
def test_a_duration_counts_from_submission(text, after):
    submitted = datetime(2026, 3, 1, 22, 15, 7, tzinfo=UTC)
    assert parse_deadline(text).at(submitted) == submitted + after


@pytest.mark.parametrize("submitted, expected", [
    (datetime(2026, 3, 1, 22, 0, tzinfo=UTC), datetime(2026, 3, 2, 6, 30, tzinfo=UTC)),    # tonight -> tomorrow
    (datetime(2026, 3, 2, 1, 0, tzinfo=UTC), datetime(2026, 3, 2, 6, 30, tzinfo=UTC)),     # after midnight: today
    (datetime(2026, 3, 2, 6, 30, tzinfo=UTC), datetime(2026, 3, 3, 6, 30, tzinfo=UTC)),    # exactly then: next one
    (datetime(2026, 12, 31, 23, 0, tzinfo=UTC), datetime(2027, 1, 1, 6, 30, tzinfo=UTC)),  # across a year
    (datetime(2026, 3, 2, 1, 0), datetime(2026, 3, 2, 6, 30, tzinfo=UTC)),                 # naive: read as UTC
    # another zone: 07:00 in UTC+2 is 05:00 UTC, so 06:30 UTC is the same morning
    (datetime(2026, 3, 2, 7, 0, tzinfo=timezone(timedelta(hours=2))), datetime(2026, 3, 2, 6, 30, tzinfo=UTC)),
])
def test_a_clock_time_is_its_next_occurrence_in_utc(submitted, expected):
    assert parse_deadline("06:30").at(submitted) == expected


def test_auto_without_a_deadline_falls_back_after_six_hours():
    submitted = datetime(2026, 3, 1, 23, 0, tzinfo=UTC)
    assert JudgingOptions(mode="auto").deadline_at(submitted) == datetime(2026, 3, 2, 5, 0, tzinfo=UTC)
    with_deadline = JudgingOptions.model_validate({"mode": "auto", "deadline": "05:45"})
    assert with_deadline.deadline_at(submitted) == datetime(2026, 3, 2, 5, 45, tzinfo=UTC)


def test_a_stored_submission_time_reads_back_into_a_deadline():
    """The job spec's ``submitted_at`` (ISO, UTC) is what the deadline counts from."""
    options = JudgingOptions.model_validate({"mode": "auto", "deadline": "2h"})
    assert options.deadline_at(datetime.fromisoformat("2026-03-01T22:15:00+00:00")) == \
        datetime(2026, 3, 2, 0, 15, tzinfo=UTC)
