"""Issue 41: nightly runs over overlapping windows score each span once per suite. A first night
reads one export file; the second night reads it again with the next file: only the new spans are
scored. Another suite, or traces.once false, scores them all; a night with nothing new says so;
a request delivered again keeps the spans it took. Real Redis, real workers."""

from __future__ import annotations

import uuid

import pytest
import redis

from evalq.cli.run import run_job
from evalq.orchestrator.once import only_unscored
from evalq.shared.core.errors import JobError
from evalq.shared.job.schema import parse_job
from tests.conftest import read_log
from tests.integration.test_otlp_traces import exported  # noqa: F401  (the fixture)

pytestmark = pytest.mark.integration


def night(uri, suite, **traces):
    return parse_job({"suite": suite, "dataset": {"uri": str(uri), "format": "otlp", "traces": traces},
                      "metrics": [{"id": "slow_len", "parameters": {"seconds": 0}}]})


def test_a_second_night_over_an_overlapping_window_scores_only_new_spans(exported, redis_url, cpu_worker, tmp_path):
    folder, _ = exported
    suite = f"support-{uuid.uuid4().hex[:6]}"
    first = night(folder / "part-0.jsonl", suite)
    everything = {i["id"] for i in night(folder, suite).instances}
    run_job(first, tmp_path / "n1", broker=redis_url, progress=False, stall_timeout=120)
    scored_first = {line["instance_id"] for line in read_log(tmp_path / "n1")}
    assert scored_first == {i["id"] for i in first.instances} and len(scored_first) == 10

    second = night(folder, suite)  # both files: yesterday's window again, and today's
    run_job(second, tmp_path / "n2", broker=redis_url, progress=False, stall_timeout=120)
    scored_second = {line["instance_id"] for line in read_log(tmp_path / "n2")}
    assert scored_second == everything - scored_first and len(scored_second) == 4
    assert second.spans["already_scored"] == 10

    with pytest.raises(JobError, match=f"was scored by an earlier run of suite '{suite}'; nothing new"):
        run_job(night(folder, suite), tmp_path / "n3", broker=redis_url, progress=False, stall_timeout=120)
    # another suite, or once off: every span again
    run_job(night(folder, suite + "-b"), tmp_path / "b", broker=redis_url, progress=False, stall_timeout=120)
    run_job(night(folder, suite, once=False), tmp_path / "all", broker=redis_url, progress=False, stall_timeout=120)
    for out in ("b", "all"):
        assert {line["instance_id"] for line in read_log(tmp_path / out)} == everything


def test_a_request_delivered_again_keeps_the_spans_it_took(exported, redis_url):
    folder, _ = exported
    r = redis.Redis.from_url(redis_url)
    suite = f"redo-{uuid.uuid4().hex[:6]}"
    job = night(folder, suite)
    only_unscored(r, job, "job-a")
    again = night(folder, suite)
    only_unscored(r, again, "job-a")  # the same job id: its own claims
    assert [i["id"] for i in again.instances] == [i["id"] for i in job.instances] and len(job.instances) == 14
    with pytest.raises(JobError, match="nothing new"):
        only_unscored(r, night(folder, suite), "job-b")
    tenant_job = night(folder, suite)
    only_unscored(r, tenant_job, "job-c", tenant="ads")  # a tenant's suite of the same name is its own
    assert len(tenant_job.instances) == 14
