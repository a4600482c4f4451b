"""Property-based: mutated jobs, data configs and dataset lines are either valid
or rejected with located messages (JobError: exit 2), never another exception
(a traceback, exit 1). Bounded so CI stays fast."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evalq.shared.core.errors import JobError
from evalq.shared.job.schema import load_job, parse_job

JSON = st.recursive(st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats(allow_nan=False)
                    | st.text(max_size=20),
                    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12),
                                                                                        children, max_size=4),
                    max_leaves=12)

VALID = {
    "instances": [{"id": "a", "input": "Q?", "actual-output": "the cat", "expected-output": ["the cat", "a cat"],
                   "context": ["doc"], "category": "x", "human": {"coherence": 3}},
                  {"id": 2, "input": "Q2", "actual-output": "dog", "expected-output": ["dog"]}],
    "judges": {"j": {"provider": "openai", "model": "m", "api_key_env": "TEST_UNIT_API_KEY",
                     "deployments": [{"region": "lab", "base_url": "http://127.0.0.1:9/v1", "tpm": 1000, "rpm": 10}]}},
    "metrics": [{"id": "bleu", "parameters": {"weights": [0.5, 0.5], "smoothing_function": "method1"}},
                {"id": "rouge"}, {"id": "exact_match", "enable": False},
                {"id": "coherence", "parameters": {"judge": "j", "threshold": 3}},
                {"id": "violence", "parameters": {"judge": "j", "threshold": 4}},
                {"id": "claims_f1", "parameters": {"judge": "j", "neutral_value": 0.25}}],
}


def paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from paths(v, prefix + (i,))


@st.composite
def mutated(draw, base):
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        all_paths = [p for p in paths(doc) if p]
        if not all_paths:
            break
        path = draw(st.sampled_from(all_paths))
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(JSON)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=10))] = draw(JSON)
        else:
            parent.append(draw(JSON))
    return doc


def assert_located(exc: JobError, *sources: str):
    """Each problem names the file it is about (the job, or its dataset) before saying what is wrong."""
    for line in exc.problems:
        assert line.startswith(sources) and ": " in line, line


FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(mutated(VALID))
def test_mutated_jobs_are_valid_or_located_errors(doc):
    try:
        parse_job(doc, source="job.json")
    except JobError as exc:
        assert_located(exc, "job.json")


DATA_CONFIG = {"id_location": "id", "model_input_location": "q", "model_output_location": "a",
               "target_output_location": "gt", "category_location": "meta.cat", "human_location": "grades",
               "target_output_delimiter": "<OR>"}
LINE = {"id": "r1", "q": "Q?", "a": "ans", "gt": "ans <OR> answer", "meta": {"cat": "c"}, "grades": {"coherence": 4}}


@FUZZ
@given(mutated({"data_config": DATA_CONFIG, "lines": [LINE, {**LINE, "id": "r2"}]}),
       st.lists(st.binary(max_size=40), max_size=2), st.sampled_from(["fail", "skip"]))
def test_mutated_data_configs_and_lines_are_valid_or_located_errors(tmp_path_factory, case, raw_lines, on_bad):
    tmp = tmp_path_factory.mktemp("fuzz")
    lines = case.get("lines") if isinstance(case.get("lines"), list) else []
    body = b"".join(json.dumps(x).encode() + b"\n" for x in lines) + b"".join(b + b"\n" for b in raw_lines)
    (tmp / "d.jsonl").write_bytes(body)
    dataset = {"uri": "d.jsonl", "format": "jsonl", "on_bad_record": on_bad}
    if "data_config" in case:
        dataset["data_config"] = case["data_config"]
    (tmp / "job.json").write_text(json.dumps({
        "dataset": dataset, "judges": VALID["judges"],
        "metrics": [{"id": "f1_score"}, {"id": "coherence", "parameters": {"judge": "j"}}]}))
    try:
        load_job(tmp / "job.json")
    except JobError as exc:
        assert_located(exc, str(tmp / "job.json"), str(tmp / "d.jsonl"))


@pytest.mark.parametrize("text", ["", "{", "[]", "null", '{"metrics": 5}', "\x00", '{"instances": [[[[[]]]]]}'])
def test_malformed_job_files(tmp_path, text):
    (tmp_path / "job.json").write_text(text)
    with pytest.raises(JobError):
        load_job(tmp_path / "job.json")
