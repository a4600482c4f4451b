"""Datasets: fmeval DataConfig locations (JMESPath), presets, formats, and
errors that name the record. Local files only; S3 is in the integration tests."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from evalq.shared.data.dataset import DataConfig, DatasetSpec, RecordError, RecordMapper, detect_preset
from evalq.shared.core.errors import JobError
from evalq.shared.job.schema import parse_job
from evalq.shared.model.runners import render_prompt

CONVERSATION = {"id": "c1", "messages": [
    {"role": "user", "content": "How do I check my order?"},
    {"role": "assistant", "content": "Look at your email.",
     "context": {"citations": [{"id": "a", "title": "t", "content": "Orders are confirmed by email."}]}},
    {"role": "user", "content": "And the EcoFire stove?"},
    {"role": "assistant", "content": "Outdoor use only.",
     "context": {"citations": [{"content": "The EcoFire is for outdoor use."},
                               {"content": "Check local regulations."}]}}]}


def write_jsonl(path, records, compress=False):
    opener = gzip.open if compress else open
    with opener(path, "wt", encoding="utf-8") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path


def job_with(dataset: dict, metrics=None, **extra) -> dict:
    return {"dataset": dataset, "metrics": metrics or [{"id": "exact_match"}], **extra}


def problems(raw) -> str:
    with pytest.raises(JobError) as info:
        parse_job(raw, source="job.json")
    return "\n".join(info.value.problems)


# --- mapping -------------------------------------------------------------------

def test_jmespath_locations_and_or_delimiter():
    mapper = RecordMapper(DataConfig(model_input_location="q.text", model_output_location="out[0]",
                                     target_output_location="gold", category_location="meta.category",
                                     difficulty_location="meta.level"))
    inst = mapper.map({"q": {"text": "Capital of the UK?"}, "out": ["London"], "gold": "London <OR> london",
                       "meta": {"category": "geo", "level": 2}}, default_id="9")
    assert inst == {"id": "9", "input": "Capital of the UK?", "actual-output": "London",
                    "expected-output": ["London", "london"], "category": "geo", "difficulty": 2}


def test_references_as_list_numbers_as_text_and_no_delimiter():
    mapper = RecordMapper(DataConfig(target_output_location="answers", model_output_location="pred",
                                     target_output_delimiter=None))
    inst = mapper.map({"answers": ["4", 4.5], "pred": 4}, default_id="1")
    assert inst["expected-output"] == ["4", "4.5"] and inst["actual-output"] == "4"
    assert RecordMapper(DataConfig(target_output_location="a", target_output_delimiter=None)).map(
        {"a": "x <OR> y"}, "1")["expected-output"] == ["x <OR> y"]


def test_wrong_types_name_the_location():
    mapper = RecordMapper(DataConfig(model_output_location="pred"))
    with pytest.raises(RecordError, match="model_output_location 'pred': expected a string, got an object"):
        mapper.map({"pred": {"text": "x"}}, "1")
    with pytest.raises(RecordError, match="expected a JSON object, got a list"):
        mapper.map([1, 2], "1")


def test_azure_conversation_preset():
    inst = RecordMapper(DataConfig(preset="azure_conversation")).map(CONVERSATION, "1")
    assert inst["id"] == "c1"
    assert inst["input"] == "And the EcoFire stove?"
    assert inst["actual-output"] == "Outdoor use only."
    assert inst["context"] == ["The EcoFire is for outdoor use.", "Check local regulations."]
    assert inst["messages"] == CONVERSATION["messages"]


def test_azure_qa_preset_with_an_override():
    config = DataConfig(preset="azure_qa", category_location="meta.kind")
    inst = RecordMapper(config).map({"question": "q", "answer": "a", "ground_truth": "g", "context": "c",
                                     "meta": {"kind": "k"}}, "3")
    assert inst == {"id": "3", "input": "q", "actual-output": "a", "expected-output": ["g"], "context": "c",
                    "category": "k"}


def test_detect_preset():
    assert detect_preset(CONVERSATION) == "azure_conversation"
    assert detect_preset({"question": "q", "answer": "a"}) == "azure_qa"
    assert detect_preset({"id": 1, "actual-output": "a"}) == "harpia"
    assert detect_preset({"prompt": "p"}) is None


@pytest.mark.parametrize("config,fragment", [
    ({"model_input_location": "question[?"}, "model_input_location: invalid JMESPath"),
    ({"target_output_locaton": "a"}, "unknown field 'target_output_locaton'"),
    ({"target_output": "a"}, "did you mean 'target_output_location'?"),
    ({"preset": "azure"}, "preset"),
    ({"dataset_mime_type": "text/csv"}, "dataset_mime_type must be one of"),
])
def test_bad_data_config(tmp_path, config, fragment):
    path = write_jsonl(tmp_path / "d.jsonl", [{"a": 1}])
    assert fragment in problems(job_with({"uri": str(path), "data_config": config}))


def test_dataset_spec_format_and_fmeval_aliases():
    assert DatasetSpec(uri="s3://b/k/qa.jsonl.gz").format == "jsonl"
    assert DatasetSpec(uri="x.json").format == "json"
    spec = DatasetSpec(data_config={"dataset_uri": "d.data", "dataset_mime_type": "application/jsonlines",
                                    "dataset_name": "tiny"})
    assert (spec.uri, spec.format) == ("d.data", "jsonl")
    with pytest.raises(ValueError, match="cannot tell the format"):
        DatasetSpec(uri="d.csv")
    with pytest.raises(ValueError, match="'uri' is required"):
        DatasetSpec()


# --- jobs reading local datasets ----------------------------------------------

def test_gz_jsonl_is_read_and_ids_default_to_line_numbers(tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl.gz",
                       [{"question": f"q{i}", "answer": "a", "ground_truth": "a"} for i in range(3)], compress=True)
    job = parse_job(job_with({"uri": str(path)}))
    assert [i["id"] for i in job.instances] == ["1", "2", "3"]
    assert [i["input"] for i in job.instances] == ["q0", "q1", "q2"]
    assert len(job.instances) == 3 and "azure_qa" in job.mapping


def test_missing_location_names_file_line_and_location(tmp_path):
    records = [{"question": "q", "answer": "a", "ground_truth": "a"}] * 3
    records[1] = {"question": "q", "answer": "a"}
    path = write_jsonl(tmp_path / "qa.jsonl", records)
    text = problems(job_with({"uri": str(path), "data_config": "azure_qa"}))
    assert f"{path} line 2: target_output_location 'ground_truth' not found, required by exact_match" in text


def test_invalid_json_line_and_skip_mode(tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl", [{"question": "q", "answer": "a", "ground_truth": "a"},
                                               '{"question": "q",', {"question": "q2", "answer": "b"},
                                               {"question": "q3", "answer": "c", "ground_truth": "c"}])
    text = problems(job_with({"uri": str(path)}))
    # the record is cut short: the error is at its end (column 18), not "column 1" of the line after it
    assert f"{path} line 2: invalid JSON at column 18: the record ends before its JSON does" in text
    assert f"{path} line 3: target_output_location 'ground_truth' not found" in text
    job = parse_job(job_with({"uri": str(path), "on_bad_record": "skip"}))
    assert [i["id"] for i in job.instances] == ["1", "4"]
    assert job.bad_records.count == 2
    assert [b["where"] for b in job.bad_records.shown] == [f"{path} line 2", f"{path} line 3"]


def test_duplicate_ids_in_a_dataset_name_both_lines(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"id": "a", "actual-output": "x", "expected-output": ["x"]},
                                              {"id": "b", "actual-output": "x", "expected-output": ["x"]},
                                              {"id": "a", "actual-output": "y", "expected-output": ["y"]}])
    assert f"{path} line 3: duplicate id; first used at line 1" in problems(job_with({"uri": str(path)}))


@pytest.mark.parametrize("small", [100_000, 1], ids=["a set", "numpy's sort"])
def test_repeated_ids_are_found_the_same_way_below_and_above_the_set_size(tmp_path, monkeypatch, small):
    """Up to SMALL_ID_CHECK ids a set finds repeats (no numpy import before the workers start);
    beyond, numpy's sort: the same lines either way, and none where there are none."""
    from evalq.shared.data import instances

    monkeypatch.setattr(instances, "SMALL_ID_CHECK", small)
    rows = [{"id": f"r{i % 7}" if i in (3, 10, 12) else f"u{i}", "actual-output": "x", "expected-output": ["x"]}
            for i in range(14)]  # r3 at lines 4 and 11, r5 once
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    found = [line for line in problems(job_with({"uri": str(path)})).splitlines() if "duplicate id" in line]
    assert found == [f"job.json: {path} line 11: duplicate id; first used at line 4"]
    path = write_jsonl(tmp_path / "e.jsonl", [dict(r, id=f"v{i}") for i, r in enumerate(rows)])
    assert len(parse_job(job_with({"uri": str(path)}), source="job.json").instances) == 14


def test_json_array_and_harpia_formats(tmp_path):
    array_path = tmp_path / "d.json"
    array_path.write_text(json.dumps([{"prompt": "p", "gold": "g", "pred": "g"}]))
    job = parse_job(job_with({"uri": str(array_path), "data_config": {
        "model_input_location": "prompt", "model_output_location": "pred", "target_output_location": "gold"}}))
    assert list(job.instances)[0]["expected-output"] == ["g"]
    harpia = tmp_path / "h.json"
    harpia.write_text(json.dumps({"instances": [{"id": "1", "input": "i", "actual-output": "o",
                                                 "expected-output": ["o"]}], "metrics": []}))
    job = parse_job(job_with({"uri": str(harpia), "format": "harpia"}))
    assert list(job.instances) == [{"id": "1", "input": "i", "actual-output": "o", "expected-output": ["o"]}]
    array_path.write_text('{"not": "an array"}')
    assert "format json expects an array of records, got an object" in problems(
        job_with({"uri": str(array_path), "data_config": "azure_qa"}))


def test_limit_and_unrecognised_shape(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "q", "answer": "a", "ground_truth": "a"}] * 5)
    assert len(parse_job(job_with({"uri": str(path), "limit": 2})).instances) == 2
    odd = write_jsonl(tmp_path / "odd.jsonl", [{"prompt": "p", "completion": "c"}])
    assert "cannot tell what the records hold (fields: completion, prompt)" in problems(job_with({"uri": str(odd)}))


def test_missing_file_and_both_sources(tmp_path):
    assert f"{tmp_path}/nope.jsonl: no such file" in problems(job_with({"uri": str(tmp_path / "nope.jsonl")}))
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "q", "answer": "a", "ground_truth": "a"}])
    assert "give either 'instances' or 'dataset', not both" in problems(
        job_with({"uri": str(path)}, instances=[]))


def test_categories_are_collected(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "q", "answer": "a", "ground_truth": "a",
                                               "category": c} for c in ("b", "a", "b")])
    assert parse_job(job_with({"uri": str(path)})).categories == ["a", "b"]
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"id": 1, "actual-output": "a", "expected-output": ["a"],
                                                "category": ["x"]}])
    assert "category_location 'category': expected a string, got a list" in problems(job_with({"uri": str(bad)}))


# --- the model under test ------------------------------------------------------

MODEL = {"provider": "openai", "model": "m", "api_key_env": "UNIT_MODEL_API_KEY",
         "deployments": [{"region": "lab", "base_url": "http://127.0.0.1:9/v1", "tpm": 1000, "rpm": 10}]}


def test_records_without_output_are_generated_when_a_model_is_given(tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "q1", "ground_truth": "a"},
                                              {"question": "q2", "answer": "a", "ground_truth": "a"}])
    assert "(or give the job a 'model' to generate it)" in problems(job_with({"uri": str(path)}))
    monkeypatch.setenv("UNIT_MODEL_API_KEY", "k")
    job = parse_job(job_with({"uri": str(path)}, model=MODEL))
    assert job.n_to_generate == 1
    assert job.generation.queues == ["generate.lab"]
    assert job.queues == ["cpu", "generate.lab"]


def test_model_problems(tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "d.jsonl", [{"ground_truth": "a", "context": "c"}])
    text = problems(job_with({"uri": str(path), "data_config": "azure_qa"},
                             model={**MODEL, "prompt_template": "Q: $question"}))
    assert "model.prompt_template" in text and "unknown placeholder(s) $question" in text
    text = problems(job_with({"uri": str(path), "data_config": "azure_qa"}, model=MODEL))
    assert "model.api_key_env: environment variable UNIT_MODEL_API_KEY is not set" in text
    monkeypatch.setenv("UNIT_MODEL_API_KEY", "k")
    text = problems(job_with({"uri": str(path), "data_config": "azure_qa"}, model=MODEL))
    assert "model_input_location 'question' not found, required to generate the missing actual-output" in text
    text = problems(job_with({"uri": str(path)}, model={"runner": "tests.plugins.nowhere:Runner"}))
    assert "model.runner: 'tests.plugins.nowhere:Runner' is not an allowed model runner (nothing was imported)" in text


def test_render_prompt():
    inst = {"input": "Why $5?", "context": ["a", "b"]}
    assert render_prompt("Context: $context\nQ: $model_input", inst) == "Context: a\n\nb\nQ: Why $5?"


@pytest.mark.parametrize("expression", ["question", "meta.category", '"actual-output"', "meta.x.y",
                                        "list.a", "answers[0]", "messages[?role=='user'] | [-1].content"])
def test_location_lookups_agree_with_jmespath(expression):
    import jmespath

    from evalq.shared.data.dataset import _getter

    record = {"question": "q", "meta": {"category": "c", "x": 3}, "actual-output": "o", "list": [1],
              "answers": ["a", "b"], "messages": [{"role": "user", "content": "hi"}]}
    assert _getter(expression)(record) == jmespath.search(expression, record)


@pytest.mark.parametrize("expression", ["messages[?role=='user'] | [-1].content", "messages[?role=='assistant'] | [-1]",
                                        "turns[?speaker == 'bot'] | [-1].text"])
def test_the_last_match_lookup_agrees_with_jmespath_on_any_record(expression):
    """The presets' "last message from ..." is read without the interpreter; on records of every
    shape (missing fields, other types, no match, several) it gives what JMESPath gives."""
    import random

    import jmespath

    from evalq.shared.data.dataset import _LAST_MATCH, _getter

    assert _LAST_MATCH.fullmatch(expression)
    items, key, field = expression.split("[")[0], expression.split("?")[1].split("=")[0].strip(), "content"
    rng = random.Random(7)
    values = [None, 1, True, "user", "assistant", "bot", {"a": 1}, [], "x"]
    lookup = _getter(expression)
    for _ in range(2000):
        elements = [{k: rng.choice(values) for k in rng.sample([key, field, "text", "other"], rng.randint(0, 4))}
                    if rng.random() < 0.8 else rng.choice(values) for _ in range(rng.randint(0, 5))]
        record = rng.choice([{items: elements}, {items: rng.choice(values)}, {}, rng.choice(values)])
        assert lookup(record) == jmespath.search(expression, record), record


def test_nesting_depth_is_measured_level_by_level():
    from evalq.shared.core.limits import too_deep

    assert too_deep([[[[{"a": [1]}]]]], 5) and not too_deep([[[[{"a": [1]}]]]], 6)
    assert not too_deep("text", 0) and not too_deep({"a": [], "b": {"c": 1}}, 2) and too_deep({"b": {"c": {}}}, 2)


def test_relative_dataset_path_is_read_from_the_job_files_folder(tmp_path, monkeypatch):
    from evalq.shared.job.schema import load_job

    folder = tmp_path / "jobs"
    (folder / "data").mkdir(parents=True)
    write_jsonl(folder / "data" / "qa.jsonl", [{"question": "q", "answer": "a", "ground_truth": "a"}])
    (folder / "job.json").write_text(json.dumps(job_with({"uri": "data/qa.jsonl"})))
    monkeypatch.chdir(tmp_path)
    job = load_job("jobs/job.json")
    assert Path(job.dataset.uri).resolve() == folder / "data" / "qa.jsonl" and len(job.instances) == 1


def test_duplicates_in_a_harpia_file_name_positions(tmp_path):
    inst = {"id": "1", "input": "i", "actual-output": "o", "expected-output": ["o"]}
    harpia = tmp_path / "h.json"
    harpia.write_text(json.dumps({"instances": [inst, {**inst, "id": "2"}, inst]}))
    assert f"{harpia} instances[2]: duplicate id; first used at instances[0]" in problems(
        job_with({"uri": str(harpia), "format": "harpia"}))


def test_reading_stops_after_too_many_bad_records(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "q", "answer": "a", "ground_truth": "a"}] +
                       ['{"broken"'] * 100)
    text = problems(job_with({"uri": str(path)}))
    assert f"{path} line 25: stopped reading here: fix the problems above first" in text
    assert "more problems" not in text and f"{path} line 26" not in text
