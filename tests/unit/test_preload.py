"""EVALQ_PRELOAD: what a worker loads as it starts (evalq.shared.job.preload, evalq.workers.preload)."""

from __future__ import annotations

import json
import logging

import pytest

from evalq.shared.core.errors import JobError
from evalq.shared.job.preload import ENV, parse, setting
from evalq.shared.job.schema import parse_job


def _problems(text: str) -> list[str]:
    with pytest.raises(JobError) as err:
        parse(text)
    return err.value.problems


def test_ids_take_their_defaults_and_entries_their_parameters():
    (spec, params), = parse("bertscore")
    assert spec.id == "bertscore" and params.batch_size == 64 and params.idf is False
    entries = parse(json.dumps([{"id": "bertscore", "parameters": {"batch_size": 8, "dtype": "bf16"}},
                                {"id": "toxicity"}]))
    assert [(s.id, getattr(p, "batch_size", None)) for s, p in entries] == [("bertscore", 8), ("toxicity", 64)]
    assert entries[0][1].dtype == "bf16"
    assert parse(" bertscore , toxicity ") and parse("") == [] and parse("  ") == []


@pytest.mark.parametrize("text, fragment", [
    ("bertscor", f"{ENV}[0]: unknown metric 'bertscor'; did you mean 'bertscore'"),
    ("bertscore,bleu", f"{ENV}[1]: bleu loads no model"),
    ('[{"id": "bertscore", "parameters": {"batch_sise": 4}}]', f"{ENV}[0].parameters: unknown parameter 'batch_sise'"),
    ('[{"id": "bertscore", "parameters": {"dtype": "fp8"}}]', f"{ENV}[0].parameters: dtype"),
    ('[{"id": "bertscore", "params": {}}]', f"{ENV}[0]: unknown field(s) params"),
    ('[{"id": "bertscore"', f"{ENV}: not valid JSON"),
    ('[1]', f"{ENV}[0]: expected {{\"id\""),
])
def test_a_bad_setting_says_where_and_what(text, fragment):
    problems = _problems(text)
    assert any(fragment in p for p in problems), problems


def test_every_problem_is_listed_at_once():
    assert len(_problems("bertscor,bleu")) == 2


def test_a_job_gives_the_setting_of_its_model_entries_only():
    job = parse_job({"instances": [{"id": "1", "actual-output": "a", "expected-output": ["b"]}],
                     "metrics": [{"id": "bleu"}, {"id": "bertscore", "parameters": {"batch_size": 4}},
                                 {"id": "toxicity"}]}, source="t")
    entries = parse(setting(job.metrics))
    assert [(s.id, p) for s, p in entries] == [(m.spec.id, m.params) for m in job.metrics if m.spec.id != "bleu"]
    assert setting([m for m in job.metrics if m.spec.id == "bleu"]) == ""


def test_the_embedded_cluster_of_evalq_run_preloads_the_jobs_models(tmp_path, monkeypatch):
    from evalq.cli.run import _embedded_env
    from evalq.shared.data.storage import Destination

    monkeypatch.delenv(ENV, raising=False)
    job = parse_job({"instances": [{"id": "1", "actual-output": "a", "expected-output": ["b"]}],
                     "metrics": [{"id": "bleu"}, {"id": "bertscore", "parameters": {"batch_size": 4}}]}, source="t")
    env = _embedded_env(job, Destination(str(tmp_path / "out")))
    assert [s.id for s, _ in parse(env[ENV])] == ["bertscore"]
    plain = parse_job({"instances": [{"id": "1", "actual-output": "a", "expected-output": ["b"]}],
                       "metrics": [{"id": "bleu"}]}, source="t")
    assert ENV not in _embedded_env(plain, Destination(str(tmp_path / "out")))
    monkeypatch.setenv(ENV, "toxicity")  # the user's own setting wins
    assert ENV not in _embedded_env(job, Destination(str(tmp_path / "out")))


def test_a_worker_loads_only_its_queues_entries():
    from evalq.workers import preload
    from evalq.workers.metrics.bertscore import metric as worker_bertscore, models

    assert preload.start({"cpu"}, "bertscore") is None
    assert preload.start({"gpu"}, "") is None
    models.clear_cache()
    before = models.stats["model_loads"]
    thread = preload.start({"gpu", "cpu"}, '[{"id": "bertscore", "parameters": {"batch_size": 4}}]')
    thread.join(120)
    assert not thread.is_alive()
    assert models.stats["model_loads"] == before + 1
    # a chunk's call finds it loaded
    from evalq.shared.metrics.params import BertScoreParams

    worker_bertscore.bertscore([{"actual-output": "a cat", "expected-output": ["a dog"]}],
                               BertScoreParams(batch_size=2))
    assert models.stats["model_loads"] == before + 1


def test_a_load_that_fails_is_logged_and_left_to_the_chunks(caplog):
    from evalq.workers import preload

    with caplog.at_level(logging.WARNING, logger="evalq.worker"):
        # validates (the parameter is a device name) but this machine has no CUDA
        thread = preload.start({"gpu"}, '[{"id": "bertscore", "parameters": {"device": "cuda"}}]')
        thread.join(120)
    assert "preloading bertscore failed" in caplog.text and "CUDA is not available" in caplog.text


def test_a_bad_setting_in_a_worker_is_logged_not_raised(caplog):
    from evalq.workers import preload

    with caplog.at_level(logging.ERROR, logger="evalq.worker"):
        assert preload.start({"gpu"}, "bertscor") is None
    assert f"{ENV} is not used" in caplog.text
