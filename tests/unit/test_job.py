"""Job validation: every problem names its place; nothing passes silently."""

from __future__ import annotations

import json

import pytest

from evalq.shared.core.errors import JobError
from evalq.shared.job.schema import load_job, parse_job

GOOD_INSTANCE = {"id": "1", "input": "q", "actual-output": "a b", "expected-output": ["a b"]}


def problems(raw) -> str:
    with pytest.raises(JobError) as info:
        parse_job(raw, source="job.json")
    return "\n".join(info.value.problems)


def test_valid_job_fills_defaults_and_skips_disabled():
    job = parse_job({"instances": [GOOD_INSTANCE],
                     "metrics": [{"id": "bleu", "enable": True, "parameters": {"weights": [1, 0]}},
                                 {"id": "rouge", "enable": False}]})
    assert [(m.id, m.position, m.name) for m in job.metrics] == [("bleu", 0, None)]
    assert job.metrics[0].params_json() == {"weights": [1.0, 0.0], "smoothing_function": "method0",
                                            "auto_reweigh": False}
    assert job.queues == ["cpu"]


def test_extra_instance_fields_are_kept():
    inst = {**GOOD_INSTANCE, "context": "ctx", "category": "geo", "messages": []}
    job = parse_job({"instances": [inst], "metrics": [{"id": "f1_score"}]})
    assert job.instances[0]["category"] == "geo"


def test_invalid_json_names_line_and_column(tmp_path):
    path = tmp_path / "job.json"
    path.write_text('{"instances": [\n  {"id": "1",}\n]}')
    with pytest.raises(JobError) as info:
        load_job(path)
    assert info.value.problems[0].startswith(f"{path}:2:14: invalid JSON")


def test_an_id_of_5000_digits_is_a_located_problem_not_a_traceback(tmp_path):
    # more digits than Python converts (sys.get_int_max_str_digits): a JobError, so exit 2 at the CLI
    path = tmp_path / "job.json"
    path.write_text('{"instances": [{"id": ' + "7" * 5000 + ', "actual-output": "a", "expected-output": ["a"]}], '
                    '"metrics": [{"id": "exact_match"}]}')
    with pytest.raises(JobError) as info:
        load_job(path)
    assert info.value.problems[0].startswith(f"{path}: a number with too many digits")


def test_missing_file(tmp_path):
    with pytest.raises(JobError, match="no such file"):
        load_job(tmp_path / "nope.json")


def test_unknown_metric_suggests():
    text = problems({"instances": [GOOD_INSTANCE], "metrics": [{"id": "bleue"}]})
    assert "metrics[0] (bleue): unknown metric 'bleue'; did you mean 'bleu'?" in text


def test_misspelt_parameter_names_it_and_suggests():
    text = problems({"instances": [GOOD_INSTANCE],
                     "metrics": [{"id": "bleu", "parameters": {"weigths": [1.0]}}]})
    assert "metrics[0] (bleu).parameters: unknown parameter 'weigths'; did you mean 'weights'?" in text


@pytest.mark.parametrize("params,fragment", [
    ({"smoothing_function": "method9"}, "smoothing_function"),
    ({"auto_reweigh": "yes"}, "auto_reweigh"),
    ({"weights": []}, "weights"),
    ({"weights": [-1.0]}, "weights"),
    ({"weights": "0.25"}, "weights"),
])
def test_ill_typed_bleu_parameters(params, fragment):
    text = problems({"instances": [GOOD_INSTANCE], "metrics": [{"id": "bleu", "parameters": params}]})
    assert f"metrics[0] (bleu).parameters: {fragment}" in text


def test_rouge_type_checked():
    text = problems({"instances": [GOOD_INSTANCE],
                     "metrics": [{"id": "rouge", "parameters": {"rouge_types": ["rougeX"]}}]})
    assert "rouge_types.0" in text


def test_disabled_metric_is_still_validated():
    text = problems({"instances": [GOOD_INSTANCE],
                     "metrics": [{"id": "f1_score"}, {"id": "bleu", "enable": False, "parameters": {"x": 1}}]})
    assert "unknown parameter 'x'" in text


def test_duplicate_instance_ids():
    text = problems({"instances": [GOOD_INSTANCE, {**GOOD_INSTANCE}], "metrics": [{"id": "f1_score"}]})
    assert "instance '1' (instances[1]): duplicate id; first used at instances[0]" in text


def test_missing_field_a_metric_needs():
    inst = {"id": "7", "actual-output": "a"}
    text = problems({"instances": [inst], "metrics": [{"id": "bleu"}, {"id": "rouge"}]})
    assert "instance '7' (instances[0]): missing 'expected-output', required by bleu, rouge" in text


def test_empty_references():
    inst = {**GOOD_INSTANCE, "expected-output": []}
    text = problems({"instances": [inst], "metrics": [{"id": "exact_match"}]})
    assert "'expected-output' is empty; exact_match needs at least one reference" in text


def test_references_must_be_a_list():
    inst = {**GOOD_INSTANCE, "expected-output": "a b"}
    text = problems({"instances": [inst], "metrics": [{"id": "exact_match"}]})
    assert "'expected-output' must be a list of strings" in text


def test_misspelt_metric_field_and_top_level_field():
    text = problems({"instances": [GOOD_INSTANCE], "metric": [],
                     "metrics": [{"id": "bleu", "enabled": True}]})
    assert "metric: unknown top-level field; did you mean 'metrics'?" in text
    assert "metrics[0] (bleu): unknown field 'enabled'; did you mean 'enable'?" in text


def test_same_metric_listed_again_with_other_parameters_needs_no_name():
    job = parse_job({"instances": [GOOD_INSTANCE], "metrics": [
        {"id": "bleu"}, {"id": "rouge"}, {"id": "bleu", "parameters": {"weights": [0.5, 0.5]}},
        {"id": "bleu", "enable": False, "parameters": {"weights": [1]}},
        {"id": "bleu", "name": "bleu1", "parameters": {"weights": [1]}}]})
    assert [(m.id, m.position, m.name) for m in job.metrics] == [
        ("bleu", 0, None), ("rouge", 1, None), ("bleu", 2, None), ("bleu", 4, "bleu1")]
    assert len({m.key for m in job.metrics}) == 4  # internal keys differ, whatever the job says
    assert [m.head()["parameters"]["weights"] for m in job.metrics if m.id == "bleu"] == [
        [0.25] * 4, [0.5, 0.5], [1.0]]
    assert "name" not in job.metrics[0].head() and job.metrics[3].head()["name"] == "bleu1"


def test_same_metric_with_the_same_resolved_parameters_is_an_error():
    # defaults filled in: {} and the default weights spelt out are the same computation
    text = problems({"instances": [GOOD_INSTANCE], "metrics": [
        {"id": "bleu"}, {"id": "rouge", "parameters": {"use_stemmer": True}},
        {"id": "bleu", "parameters": {"weights": [0.25, 0.25, 0.25, 0.25], "smoothing_function": "method0"}},
        {"id": "rouge", "name": "stemmed", "parameters": {"use_stemmer": True}}]})
    assert ("job.json: metrics[2] (bleu): same metric and parameters as metrics[0] (defaults filled in)"
            in text)
    assert "job.json: metrics[3] (rouge): same metric and parameters as metrics[1]" in text
    # a disabled repeat is validated, not compared
    parse_job({"instances": [GOOD_INSTANCE], "metrics": [{"id": "bleu"}, {"id": "bleu", "enable": False}]})
    assert "metrics[1] (bleu).parameters: unknown parameter 'weight'" in problems(
        {"instances": [GOOD_INSTANCE], "metrics": [{"id": "bleu"}, {"id": "bleu", "enable": False,
                                                                   "parameters": {"weight": [1]}}]})


def test_names_are_optional_but_distinct_and_non_empty():
    text = problems({"instances": [GOOD_INSTANCE], "metrics": [
        {"id": "bleu", "name": "x"}, {"id": "rouge", "name": "x"}, {"id": "f1_score", "name": ""},
        {"id": "exact_match", "name": 3, "enable": False}]})
    assert "metrics[1] (rouge): name 'x' is already used by metrics[0]" in text
    assert "metrics[2] (f1_score): 'name' must be a non-empty string of at most 200 characters, got \"\"" in text
    assert "metrics[3] (exact_match): 'name' must be a non-empty string of at most 200 characters, got 3" in text


def test_missing_field_names_a_repeated_metric_once():
    inst = {k: v for k, v in GOOD_INSTANCE.items() if k != "expected-output"}
    text = problems({"instances": [inst], "metrics": [{"id": "bleu"}, {"id": "bleu", "parameters": {"weights": [1]}},
                                                      {"id": "rouge"}]})
    assert "missing 'expected-output', required by bleu, rouge" in text


def test_all_problems_reported_at_once():
    raw = {"instances": [{"id": "1", "actual-output": 3}, {"id": "1", "actual-output": "x"}],
           "metrics": [{"id": "f1_score"}, {"id": "nope"}]}
    text = problems(raw)
    assert text.count("\n") >= 3


def test_no_enabled_metric():
    with pytest.raises(JobError, match="no metric is enabled"):
        parse_job({"instances": [GOOD_INSTANCE], "metrics": [{"id": "bleu", "enable": False}]})


def test_top_level_must_be_object():
    assert "expected an object" in problems(json.loads("[1, 2]"))


def test_judge_chunks_spread_over_deployments_by_tpm(monkeypatch):
    from collections import Counter

    monkeypatch.delenv("EVALQ_ENDPOINTS", raising=False)  # this orchestrator has no allow-list

    from evalq.orchestrator.submit import plan

    monkeypatch.setenv("UNIT_API_KEY", "k")
    judges = {"j": {"provider": "openai", "model": "m", "api_key_env": "UNIT_API_KEY", "deployments": [
        {"region": "big", "tpm": 60000, "rpm": 10}, {"region": "small", "tpm": 20000, "rpm": 10}]}}
    instances = [{**GOOD_INSTANCE, "id": str(i)} for i in range(8)]
    metrics = [{"id": m, "parameters": {"judge": "j"}} for m in ("coherence", "fluency", "relevance")]
    job = parse_job({"instances": instances, "judges": judges, "metrics": metrics + [{"id": "bleu"}]})
    chunks = list(plan(job, chunk_size=2))
    judged = Counter(c.queue for c in chunks if not c.metric_key.startswith("bleu@"))
    assert judged == {"judge.big": 9, "judge.small": 3}
    assert all(c.deployment == c.queue.split(".", 1)[1] for c in chunks if c.deployment)
    assert {c.queue for c in chunks if c.metric_key == "bleu@3"} == {"cpu"}
    assert job.queues == ["cpu", "judge.big", "judge.small"]


def test_embedded_workers_include_a_jobs_consumer_without_changing_pools():
    from evalq.cli.embedded import _worker_groups
    from evalq.cli.workerargs import worker_argv

    groups = _worker_groups(["judge.eu", "judge.us", "cpu", "evalq.jobs"])
    assert groups == {"judge": ["judge.eu", "judge.us", "evalq.jobs"], "cpu": ["cpu"]}
    argv = worker_argv(groups["judge"])
    assert argv[argv.index("-P") + 1] == "threads"  # the jobs queue does not turn judges into prefork
    assert argv[argv.index("-Q") + 1] == "judge.eu,judge.us,evalq.jobs,evalq.control"
    argv = worker_argv(["evalq.jobs"])
    assert argv[argv.index("-P") + 1] == "prefork"


def test_cpu_entries_over_the_same_instances_are_planned_together(monkeypatch):
    """bleu, rouge and exact_match (cpu, chunks of one size) go out as bleu's chunks; the judge
    entry, and slow_len (chunks of 2), keep their own; the stage still counts every entry's."""
    from evalq.orchestrator.submit import job_spec, plan
    from evalq.shared.cluster.spec import chunk_ids, plan as plan_spec, stage_total

    monkeypatch.delenv("EVALQ_ENDPOINTS", raising=False)
    monkeypatch.setenv("UNIT_API_KEY", "k")
    judges = {"j": {"provider": "openai", "model": "m", "api_key_env": "UNIT_API_KEY",
                    "deployments": [{"region": "eu", "tpm": 1000, "rpm": 10}]}}
    instances = [{**GOOD_INSTANCE, "id": str(i)} for i in range(10)]
    job = parse_job({"instances": instances, "judges": judges, "metrics": [
        {"id": "bleu"}, {"id": "rouge"}, {"id": "coherence", "parameters": {"judge": "j"}},
        {"id": "exact_match"}, {"id": "slow_len"}]})
    spec = job_spec(job)
    entries = spec["metrics"]
    assert entries["bleu@0"]["companions"] == ["rouge@1", "exact_match@3"]
    assert entries["rouge@1"]["led_by"] == entries["exact_match@3"]["led_by"] == "bleu@0"
    assert not {"companions", "led_by"} & (entries["coherence@2"].keys() | entries["slow_len@4"].keys())
    chunks = list(plan_spec(spec, "metrics"))
    assert {c.metric_key for c in chunks} == {"bleu@0", "coherence@2", "slow_len@4"}
    assert [c.metric_key for c in plan(job)] == [c.metric_key for c in chunks]  # what `evalq validate` counts
    assert stage_total(spec, "metrics") == len(chunks) + 2  # rouge's and exact_match's one chunk each count too
    assert chunk_ids(spec, "bleu@0", 0) == ["rouge@1:0", "exact_match@3:0", "bleu@0:0"]
    assert chunk_ids(spec, "slow_len@4", 4) == ["slow_len@4:4"]

    monkeypatch.setenv("EVALQ_GROUP_ENTRIES", "0")
    spec = job_spec(job)
    assert not any({"companions", "led_by"} & e.keys() for e in spec["metrics"].values())
    assert len(list(plan_spec(spec, "metrics"))) == stage_total(spec, "metrics")


@pytest.mark.parametrize("tpm, said", [
    (10 ** 12, "Input should be less than or equal to 200000000, or 'auto'"),
    ("lots", "Input should be a valid integer, unable to parse string as an integer, or 'auto'"),
])
def test_a_judge_field_of_several_kinds_is_one_problem_and_its_entries_say_nothing_more(tpm, said):
    """Issue 74, item 6: a TPM above the maximum read `tpm.constrained-int: ...`, then
    `tpm.literal['auto']: Input should be 'auto'`, then `no judge named 'sim' (judges: none defined)`
    for the entry that names the judge. Now: the field, once, with what each of its kinds expects."""
    judge = {"provider": "openai", "model": "m", "api_key_env": "TEST_UNIT_API_KEY",
             "deployments": [{"region": "lab", "base_url": "http://127.0.0.1:9/v1", "tpm": tpm, "rpm": 100}]}
    text = problems({"instances": [GOOD_INSTANCE], "judges": {"sim": judge},
                     "metrics": [{"id": "fluency", "parameters": {"judge": "sim"}},
                                 {"id": "coherence", "parameters": {"judge": "sim", "panel": ["sim", "other"]}}]})
    assert text.splitlines()[0] == f"job.json: judges.sim.deployments.0.tpm: {said}", text
    assert "constrained-int" not in text and "literal[" not in text, text
    assert "no judge named 'sim'" not in text, text
    assert "no judge named 'other'" in text, text  # a judge never declared is still named
