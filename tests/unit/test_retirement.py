"""Judges that retire (issue 75): what a provider's model list says of when a model stops answering
(OpenAI's ``shutdown_date``, a date or epoch seconds; Azure OpenAI's ``deprecation.inference``), and
which judges retire within the warning's days."""

from __future__ import annotations

import datetime

from evalq.shared.job.schema import parse_job
from evalq.shared.judging.retirement import as_date, retiring, said, shutdown_of

TODAY = datetime.date(2026, 11, 29)


def test_a_providers_list_says_when_a_model_retires_in_either_form():
    openai_list = {"data": [{"id": "gpt-5", "shutdown_date": "2026-12-11"}, {"id": "o3", "shutdown_date": 1796947200},
                            {"id": "gpt-4.1"}]}
    assert shutdown_of(openai_list, "gpt-5") == datetime.date(2026, 12, 11)
    assert shutdown_of(openai_list, "o3") == datetime.datetime.fromtimestamp(1796947200, datetime.timezone.utc).date()
    assert shutdown_of(openai_list, "gpt-4.1") is None and shutdown_of(openai_list, "gpt-4o") is None
    azure_list = {"data": [{"id": "gpt-4o", "deprecation": {"fine_tune": "2026-01-01", "inference": "2027-01-14T00:00:00Z"}}]}
    assert shutdown_of(azure_list, "gpt-4o") == datetime.date(2027, 1, 14)
    assert shutdown_of(None, "gpt-4o") is None and shutdown_of({"data": [3, {"id": "x", "shutdown_date": "soon"}]}, "x") is None
    assert as_date(True) is None and as_date("") is None


def test_only_a_judge_retiring_within_the_days_is_said():
    job = parse_job({"instances": [{"id": "1", "input": "q", "actual-output": "a"}],
                     "judges": {name: {"provider": "openai", "model": model, "api_key_env": "TEST_UNIT_API_KEY",
                                       "deployments": [{"region": "lab", "base_url": "http://127.0.0.1:9/v1",
                                                        "tpm": 1000, "rpm": 10}]}
                                for name, model in (("soon", "gpt-5"), ("later", "gpt-4.1"), ("gone", "o1"))},
                     "metrics": [{"id": "coherence", "parameters": {"judge": "soon"}}]})
    said_by = {"gpt-5": "2026-12-11", "gpt-4.1": "2027-03-01", "o1": "2026-11-01"}
    found = retiring(sorted(job.judges.items()), lambda judge, d: as_date(said_by[judge.model]), today=TODAY, days=30)
    assert [(f["judge"], f["date"], f["days"]) for f in found] == [("gone", "2026-11-01", -28), ("soon", "2026-12-11", 12)]
    assert said(found[1]) == "judge 'soon' (gpt-5, region lab): retires on 2026-12-11, in 12 days"
    assert said(found[0]) == "judge 'gone' (o1, region lab): retired on 2026-11-01, 28 days ago"
    assert retiring(sorted(job.judges.items()), lambda judge, d: None, today=TODAY, days=30) == []
