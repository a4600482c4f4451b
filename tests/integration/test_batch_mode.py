"""Judging through the providers' Batch API (issue #24), end to end: real Celery workers on a
private Redis, judge-sim serving the chat, Files and Batches APIs over loopback HTTP, and the
real ``openai`` SDK. A job in batch mode gives the values the same job gives synchronously,
for every judge metric family (quality, safety with content_safety, claims), makes no
synchronous chat call, holds the deployment's enqueued-token quota, retries failed and
expired lines, falls back to synchronous calls at the ``auto`` deadline, survives a worker
SIGKILLed while its batch runs, cancels its batches with the job, and sends nothing to an
endpoint off the allow-list. Expected values come from the sync run of the same job and from
judge-sim's own counters, never from the batch path under test."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
import redis

from evalq.cli.run import run_job
from evalq.shared.cluster import keys
from evalq.shared.job.schema import parse_job
from evalq.sim import JudgeSim, Region
from tests.conftest import read_log, running_worker, start_worker, stop_worker, wait_for_worker

pytestmark = pytest.mark.integration

SECRET = "sk-evalq-batchmode-" + uuid.uuid4().hex
KEY_ENV = "TEST_BATCH_MODE_API_KEY"
FAST = {"EVALQ_BATCH_TICK": "0.1", "EVALQ_BATCH_SETTLE": "0.3", "EVALQ_BATCH_POLL": "0.2",
        "EVALQ_BATCH_POLL_MAX": "0.5", KEY_ENV: SECRET}
REGIONS = ("bqa", "bqb", "bqslow", "bqflaky", "bqtight", "bqexp", "bqgen", "bqaz")
QUOTA = 6000  # bqtight's enqueued-token limit, at the provider and in the job
PRICE = {"input_per_1k": 1.0, "output_per_1k": 2.0}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    from evalq.cli.embedded import EmbeddedRedis

    server = EmbeddedRedis(tmp_path_factory.mktemp("batch-redis"))
    server.start()
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def sim():
    os.environ[KEY_ENV] = SECRET
    regions = [Region("bqa", batch_delay=0.2), Region("bqb", batch_delay=0.2),
               Region("bqslow", batch_delay=3600),
               Region("bqflaky", batch_delay=0.2, batch_fail_fraction=0.5),
               Region("bqtight", batch_delay=0.5, enqueued_tokens=QUOTA),
               Region("bqexp", batch_delay=3600, batch_expire_after=0.5), Region("bqkill", batch_delay=2.0),
               Region("bqgen", batch_delay=0.2), Region("bqtrap", batch_delay=0.2), Region("bqaz", batch_delay=0.2),
               Region("bqcut", batch_delay=3600)]
    with JudgeSim(regions, latency=0.002, api_key=SECRET, seed=7) as s:
        yield s


@pytest.fixture(scope="module")
def worker(broker, tmp_path_factory):
    queues = ",".join(f"judge.{r}" for r in REGIONS) + ",generate.bqgen"
    yield from running_worker(broker, queues, tmp_path_factory.mktemp("batch-workers"), "bq",
                              concurrency=4, env=FAST)


def judge(sim, region: str, quota: int = 50_000_000, **extra) -> dict:
    return {"provider": "openai", "model": "judge-sim", "api_key_env": KEY_ENV, "max_tokens": 200,
            "max_retries": 1, "timeout": 5, "price": PRICE,
            "deployments": [{"region": region, "base_url": sim.base_url(region), "tpm": 10_000_000,
                             "rpm": 100_000, "batch": {"enqueued_tokens": quota}}], **extra}


def instances(tag: str, n: int) -> list[dict]:
    # judge-sim's markers give the claims extracted from a text (seed README: [[sim:claims=a;b]])
    return [{"id": f"q{i}", "input": f"What is item {i} of {tag}?",
             "actual-output": f"Item {i} is a blue box. It weighs {i} kg. {tag} [[sim:claims=blue_box;weighs_{i}_kg]]",
             "expected-output": [f"Item {i} is a blue box weighing {i} kg. [[sim:claims=a_box;mass_{i}_kg;blue]]",
                                 f"A box. [[sim:claims=box_{i}]]"],
             "context": [f"Item {i}: a blue box.", f"Item {i} weighs {i} kg."]} for i in range(n)]


METRICS = [{"id": "fluency", "parameters": {"judge": "j"}},
           {"id": "content_safety", "parameters": {"judge": "j"}},
           {"id": "violence", "parameters": {"judge": "j"}},
           {"id": "faithfulness", "parameters": {"judge": "j"}},
           {"id": "claims_f1", "parameters": {"judge": "j"}}]


def job(sim, region: str, mode: str, tag: str, n: int = 6, metrics=None, **judging) -> dict:
    return {"instances": instances(tag, n), "judges": {"j": judge(sim, region)},
            "judging": {"cache": False, "mode": mode, **judging}, "metrics": metrics or METRICS}


def run(spec: dict, out: Path, broker: str, **kw) -> None:
    run_job(parse_job(spec), out, broker=broker, progress=False, stall_timeout=120, **kw)


def values(out: Path) -> dict:
    """Per (entry, instance) what was recorded: the value, or the error."""
    return {(line["metric"], line["instance_id"]): line.get("result", line.get("error"))
            for line in read_log(out)}


def test_batch_mode_gives_the_sync_values_with_no_sync_call(sim, worker, broker, tmp_path):
    tag = uuid.uuid4().hex[:8]
    sim.reset_stats()
    run(job(sim, "bqa", "sync", tag), tmp_path / "sync", broker)
    sync_stats = sim.stats()["bqa"]
    assert sync_stats["requests"] > 0 and sync_stats["batch"]["batches_created"] == 0

    sim.reset_stats()
    run(job(sim, "bqb", "batch", tag), tmp_path / "batch", broker)
    stats = sim.stats()["bqb"]
    assert stats["requests"] == 0  # not one synchronous chat call
    # claims: extraction, then verification in rounds (faithfulness asks a claim's second
    # passage only when the first does not entail it), each round one batch
    assert stats["batch"]["batches_created"] >= 3
    assert stats["batch"]["lines_answered"] == sync_stats["requests"]  # the same calls, each once

    sync, batch = values(tmp_path / "sync"), values(tmp_path / "batch")
    assert sync.keys() == batch.keys() and len(sync) == 6 * len(METRICS)
    assert batch == sync
    scored = [v for (m, _), v in batch.items() if m in ("faithfulness", "claims_f1")]
    assert all(isinstance(v, dict) and v["score"] is not None for v in scored), scored  # claims were checked
    results = json.loads((tmp_path / "batch" / "results.json").read_text())
    for entry in results:
        j = entry["judge"]
        assert j["by_path"]["sync"]["calls"] == 0
        assert j["by_path"]["batch"]["calls"] == j["calls"] > 0
        # half price: the batch cost is the tokens at half the synchronous price
        expected = (j["prompt_tokens"] * PRICE["input_per_1k"] + j["completion_tokens"] * PRICE["output_per_1k"]) \
            / 1000 / 2
        assert j["cost"] == pytest.approx(expected, abs=1e-5)


def fluency_job(sim, region: str, mode: str, tag: str, n: int, quota: int = 50_000_000, **judging) -> dict:
    return {"instances": instances(tag, n), "judges": {"j": judge(sim, region, quota)},
            "judging": {"cache": False, "mode": mode, **judging},
            "metrics": [{"id": "fluency", "parameters": {"judge": "j"}}]}


def submit(broker: str, spec: dict, out: Path) -> str:
    from evalq.orchestrator.submit import submit as send

    return send(redis.Redis.from_url(broker), broker, parse_job(spec), out=str(out))


def wait(broker: str, job_id: str, timeout: float = 120) -> str:
    from evalq.cli.wait import wait as waiting

    return waiting(redis.Redis.from_url(broker), broker, job_id, on_progress=lambda n: None,
                   check=lambda: None, stall_timeout=timeout)


def until(predicate, timeout: float = 30, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.1)


def test_the_enqueued_token_quota_is_held_across_jobs(sim, worker, broker, tmp_path):
    sim.reset_stats()
    tags = [uuid.uuid4().hex[:8] for _ in range(2)]
    ids = [submit(broker, fluency_job(sim, "bqtight", "batch", tag, 8, quota=QUOTA), tmp_path / tag)
           for tag in tags]
    assert [wait(broker, job_id) for job_id in ids] == ["done", "done"]
    stats = sim.stats()["bqtight"]["batch"]
    assert stats["batches_failed"] == 0  # the provider never refused a batch over the limit
    assert 0 < stats["peak_enqueued_tokens"] <= QUOTA
    # 16 lines of ~450 tokens (two jobs' 8: a batch holds one job's lines) do not fit 6000 at once: at
    # least two batches, never both enqueued together (the peak above). How many more depends on how
    # the lines meet the settle time (a loaded machine gathers each job's 8 into one)
    assert stats["batches_created"] >= 2
    assert stats["lines_answered"] == 16 and sim.stats()["bqtight"]["requests"] == 0
    for tag in tags:
        assert all(isinstance(v, dict) for v in values(tmp_path / tag).values())


def test_failed_and_expired_lines_go_into_the_next_batch_then_synchronously(sim, worker, broker, tmp_path):
    """Judge f's provider fails half its lines (drawn again on each try), judge x's batches all
    expire: every item still ends with its value, the lines failing twice sent synchronously."""
    tag = uuid.uuid4().hex[:8]

    def spec(flaky: str, expiring: str, mode: str) -> dict:
        return {"instances": instances(tag, 8), "judges": {"f": judge(sim, flaky), "x": judge(sim, expiring)},
                "judging": {"cache": False, "mode": mode},
                "metrics": [{"id": "fluency", "parameters": {"judge": "f"}},
                            {"id": "coherence", "parameters": {"judge": "x"}, "name": "coh"}]}

    run(spec("bqa", "bqa", "sync"), tmp_path / "sync", broker)  # replies depend on the request, not the region
    sim.reset_stats()
    run(spec("bqflaky", "bqexp", "batch"), tmp_path / "batch", broker)
    assert values(tmp_path / "batch") == values(tmp_path / "sync")
    flaky, expiring = sim.stats()["bqflaky"], sim.stats()["bqexp"]
    fluency, coherence = (e["judge"] for e in json.loads((tmp_path / "batch" / "results.json").read_text()))
    assert flaky["batch"]["lines_failed"] > 0 and flaky["batch"]["batches_created"] >= 2
    assert fluency["by_path"]["batch"]["failed_lines"] == flaky["batch"]["lines_failed"]
    assert fluency["by_path"]["batch"]["calls"] == flaky["batch"]["lines_answered"]
    # those that failed twice (a quarter on average; the expiring judge shows that path for sure)
    assert fluency["by_path"]["sync"]["calls"] == flaky["requests"]
    assert fluency["by_path"]["batch"]["calls"] + fluency["by_path"]["sync"]["calls"] == 8
    assert expiring["batch"]["batches_expired"] == 2 and expiring["batch"]["lines_expired"] == 16  # two batches each
    assert expiring["requests"] == 8
    assert coherence["by_path"]["batch"] == {**coherence["by_path"]["batch"], "calls": 0, "failed_lines": 16}
    assert coherence["by_path"]["sync"]["calls"] == 8


def test_auto_falls_back_to_sync_calls_at_the_deadline(sim, worker, broker, tmp_path):
    tag = uuid.uuid4().hex[:8]
    run(fluency_job(sim, "bqa", "sync", tag, 4), tmp_path / "sync", broker)
    sim.reset_stats()
    started = time.monotonic()
    run(fluency_job(sim, "bqslow", "auto", tag, 4, deadline="4s"), tmp_path / "auto", broker)
    assert time.monotonic() - started >= 3  # it waited for the batch until the deadline
    assert values(tmp_path / "auto") == values(tmp_path / "sync")
    stats = sim.stats()["bqslow"]
    assert stats["batch"]["batches_created"] == 1 and stats["batch"]["batches_cancelled"] == 1
    assert stats["requests"] == 4  # what had not come back was sent synchronously


def test_cancel_cancels_the_provider_batches(sim, worker, broker, tmp_path):
    from evalq.orchestrator.jobs import cancel_job, job_status, render

    sim.reset_stats()
    r = redis.Redis.from_url(broker)
    job_id = submit(broker, fluency_job(sim, "bqslow", "batch", uuid.uuid4().hex[:8], 3), tmp_path / "out")
    until(lambda: sim.stats()["bqslow"]["batch"]["batches_created"] == 1, what="no batch was created")
    until(lambda: (job_status(r, job_id).get("batch") or {}).get("batches", [{}])[0].get("state") == "in_progress",
          what="the batch was not polled")
    info = job_status(r, job_id)
    shown = info["batch"]["batches"][0]
    assert shown["id"].startswith("batch_") and shown["lines"] == 3 and shown["region"] == "bqslow"
    assert shown["expected_end"] is not None and info["batch"]["parked_chunks"] >= 1
    assert shown["id"] in render(info, one=True)
    cancel_job(r, broker, job_id)
    until(lambda: sim.stats()["bqslow"]["batch"]["batches_cancelled"] == 1, what="the batch was not cancelled")
    until(lambda: r.sismember(keys.BATCH_JOBS, job_id) == 0, what="the job still has batch work")
    assert sim.stats()["bqslow"]["requests"] == 0


def test_a_worker_killed_while_its_batch_runs_neither_loses_it_nor_sends_it_twice(sim, broker, tmp_path):
    tag = uuid.uuid4().hex[:8]
    env = {**FAST, "EVALQ_BATCH_LOCK": "2"}
    sim.reset_stats()
    first = start_worker(broker, "judge.bqkill", tmp_path, concurrency=2, env=env, name="bqk1")
    wait_for_worker(broker, "bqk1")
    job_id = submit(broker, fluency_job(sim, "bqkill", "batch", tag, 5), tmp_path / "out")
    until(lambda: sim.stats()["bqkill"]["batch"]["batches_created"] == 1, what="no batch was created")
    time.sleep(0.5)  # polling
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    second = start_worker(broker, "judge.bqkill", tmp_path, concurrency=2, env=env, name="bqk2")
    try:
        wait_for_worker(broker, "bqk2")
        assert wait(broker, job_id) == "done"
    finally:
        stop_worker(second)
    stats = sim.stats()["bqkill"]
    assert stats["batch"]["batches_created"] == 1 and stats["batch"]["lines_answered"] == 5
    assert stats["requests"] == 0
    assert all(isinstance(v, dict) for v in values(tmp_path / "out").values()) and len(values(tmp_path / "out")) == 5


def test_generation_and_judging_both_go_by_batch_and_a_cached_call_never_does(sim, worker, broker, tmp_path):
    tag = uuid.uuid4().hex[:8]
    model = {**judge(sim, "bqgen"), "cache": True}
    items = [{"id": f"g{i}", "input": f"Say something about {i} {tag}."} for i in range(4)]

    def spec(mode: str) -> dict:
        return {"instances": items, "model": model, "judges": {"j": judge(sim, "bqgen")},
                "judging": {"cache": True, "mode": mode}, "metrics": [{"id": "fluency", "parameters": {"judge": "j"}}]}

    sim.reset_stats()
    run(spec("sync"), tmp_path / "sync", broker)
    assert sim.stats()["bqgen"]["requests"] == 8  # 4 generated, 4 judged
    r = redis.Redis.from_url(broker)
    r.delete(*r.keys("evalq:judgecache:*"))
    sim.reset_stats()
    run(spec("batch"), tmp_path / "batch", broker)
    stats = sim.stats()["bqgen"]
    assert stats["requests"] == 0 and stats["batch"]["lines_answered"] == 8
    assert stats["batch"]["batches_created"] == 2  # the generation stage's, then the metric's
    assert values(tmp_path / "batch") == values(tmp_path / "sync")
    run_json = json.loads((tmp_path / "batch" / "run.json").read_text())
    assert run_json["generation"]["judge"]["by_path"]["batch"]["calls"] == 4

    # the same job again: every call is in the cross-run cache, so no line goes into a batch
    sim.reset_stats()
    run(spec("batch"), tmp_path / "again", broker)
    stats = sim.stats()["bqgen"]
    assert stats["requests"] == 0 and stats["batch"]["files_uploaded"] == 0
    assert values(tmp_path / "again") == values(tmp_path / "sync")


def test_uploads_go_only_where_the_allow_list_lets_them(sim, broker, tmp_path, monkeypatch):
    """The job reaches the worker without the submitter's check; the worker's own
    EVALQ_ENDPOINTS does not allow judge-sim: nothing is uploaded, nothing is called, and
    every item ends with the refusal as its error."""
    name = f"bqt{uuid.uuid4().hex[:6]}"
    env = {**FAST, "EVALQ_ENDPOINTS": f"{KEY_ENV}=https://*.openai.azure.com"}
    guard = start_worker(broker, "judge.bqtrap", tmp_path, concurrency=2, env=env, name=name)
    try:
        wait_for_worker(broker, name)
        monkeypatch.delenv("EVALQ_ENDPOINTS")  # this submitter checks nothing
        sim.reset_stats()
        run(fluency_job(sim, "bqtrap", "batch", uuid.uuid4().hex[:8], 3), tmp_path / "out", broker)
    finally:
        stop_worker(guard)
    stats = sim.stats()["bqtrap"]
    assert stats["requests"] == 0 and stats["batch"]["requests"] == 0  # not one byte reached it
    errors = list(values(tmp_path / "out").values())
    assert len(errors) == 3 and all("not sent" in e and "not an endpoint" in e for e in errors), errors
    assert SECRET not in guard.log_path.read_text()


def test_azure_openai_batches_give_the_sync_values(sim, worker, broker, tmp_path):
    """AzureOpenAI's form: api-version, /chat/completions, the deployment as each line's model."""
    azure = {"provider": "azure", "model": "gpt-4o", "api_key_env": KEY_ENV, "api_version": "2024-10-21",
             "max_tokens": 200, "max_retries": 1, "timeout": 5,
             "deployments": [{"region": "bqaz", "endpoint": sim.azure_endpoint("bqaz"), "deployment": "judge-dep",
                              "tpm": 10_000_000, "rpm": 100_000, "batch": {"enqueued_tokens": 50_000_000}}]}
    tag = uuid.uuid4().hex[:8]

    def spec(mode: str) -> dict:
        return {"instances": instances(tag, 3), "judges": {"j": azure}, "judging": {"cache": False, "mode": mode},
                "metrics": [{"id": "fluency", "parameters": {"judge": "j"}},
                            {"id": "content_safety", "parameters": {"judge": "j"}}]}

    run(spec("sync"), tmp_path / "sync", broker)
    sim.reset_stats()
    run(spec("batch"), tmp_path / "batch", broker)
    stats = sim.stats()["bqaz"]
    assert stats["requests"] == 0 and stats["batch"]["lines_answered"] == 6
    assert values(tmp_path / "batch") == values(tmp_path / "sync")


def test_a_creation_cut_short_is_found_again_not_made_twice(sim, broker):
    """A manager died after the provider created the batch but before its id was saved: the
    next one finds it by the record's id in its metadata and polls it, creating nothing."""
    from datetime import datetime, timezone

    from evalq.shared.judging.judges import JudgeConfig
    from evalq.workers.judge.batch_lines import BatchLines
    from evalq.workers.judge.batch_records import BatchTiming, records
    from evalq.workers.judge.batches import Manager
    from evalq.workers.judge.client import chat_request

    r = redis.Redis.from_url(broker)
    job_id = f"cut-{uuid.uuid4().hex[:8]}"
    spec = {"judges": {"j": judge(sim, "bqcut")}, "judging": {"mode": "batch"},
            "submitted_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    r.set(keys.spec(job_id), json.dumps(spec))
    r.set(keys.status(job_id), "running")
    config = JudgeConfig.model_validate(spec["judges"]["j"])
    lines = BatchLines(r, job_id, "fluency", "j", config, list(config.deployments))
    for i in range(3):
        body = chat_request(config, [{"role": "user", "content": f"rate {i} {job_id}"}])
        assert lines.register(f"{i:064x}", body, item=i) == 1
    sim.reset_stats()
    manager = Manager(r, None, {"bqcut"}, BatchTiming(settle=0, poll_first=0.01, poll_max=0.01))
    manager.submit(job_id, spec, "bqcut", time.time())
    (rec,) = records(r, job_id).values()
    created = rec["provider"]
    assert created and sim.stats()["bqcut"]["batch"]["batches_created"] == 1
    rec.update(provider=None, state="creating", next=0)  # as a manager that died before saving it left it
    r.hset(keys.batch(job_id, "open"), rec["id"], json.dumps(rec))
    manager.advance(job_id, spec, rec, time.time())
    (rec,) = records(r, job_id).values()
    assert rec["provider"] == created and rec["state"] in ("validating", "in_progress")
    assert sim.stats()["bqcut"]["batch"]["batches_created"] == 1 and sim.stats()["bqcut"]["batch"]["files_uploaded"] == 1
    r.set(keys.status(job_id), "cancelled")
    manager.job_tick(job_id, "bqcut", time.time())
    assert not r.sismember(keys.BATCH_JOBS, job_id)
    until(lambda: sim.stats()["bqcut"]["batch"]["batches_cancelled"] == 1, what="the batch was not cancelled")


def test_agent_metrics_turn_by_turn_by_batch_give_the_sync_values(sim, worker, broker, tmp_path):
    """The agent judge metrics are batchable like the others: every turn's (and every call's)
    question of a conversation goes into the batch at once, and the values equal a sync run's."""
    from tests.agents.test_conversations import conversation

    tag = uuid.uuid4().hex[:8]
    chats = [conversation(f"{tag}-{n}", [1 + n % 5, 1 + (n + 2) % 5, 1 + (n + 4) % 5], calls=[1, 3]) for n in range(4)]
    metrics = [{"id": "intent_resolution", "parameters": {"judge": "j", "turns": "all"}},
               {"id": "tool_call_accuracy", "parameters": {"judge": "j", "turns": "all"}},
               {"id": "conversation_relevance", "parameters": {"judge": "j"}}]

    def spec(region: str, mode: str) -> dict:
        return {"instances": chats, "judges": {"j": judge(sim, region)}, "judging": {"cache": False, "mode": mode},
                "metrics": metrics}

    sim.reset_stats()
    run(spec("bqa", "sync"), tmp_path / "sync", broker)
    sync_calls = sim.stats()["bqa"]["requests"]
    assert sync_calls == 4 * (3 + 2 + 1)  # per conversation: 3 turns, 2 calls, the whole exchange
    sim.reset_stats()
    run(spec("bqb", "batch"), tmp_path / "batch", broker)
    stats = sim.stats()["bqb"]
    assert stats["requests"] == 0 and stats["batch"]["lines_answered"] == sync_calls
    assert values(tmp_path / "batch") == values(tmp_path / "sync")
    assert all(len(v["turns"]) == 3 for (m, _), v in values(tmp_path / "batch").items() if m == "intent_resolution")


def test_a_panel_and_a_pairwise_comparison_go_through_batches_too(sim, worker, broker, tmp_path):
    """Issue 61: a panel's members and a comparison's two orders are judge calls like any: in batch
    mode every one goes into a batch (no synchronous chat call), and the values are the sync run's."""
    tag = uuid.uuid4().hex[:8]

    def spec(mode: str, regions: tuple[str, str]) -> dict:
        items = [{**inst, "baseline-output": f"Baseline {k} {tag}."} for k, inst in enumerate(instances(tag, 5))]
        return {"instances": items, "judges": {"j": judge(sim, regions[0]), "k": judge(sim, regions[1], model="judge-k")},
                "judging": {"cache": False, "mode": mode},
                "metrics": [{"id": "coherence", "parameters": {"judge": ["j", "k"], "panel_aggregate": "median"}},
                            {"id": "pairwise", "parameters": {"judge": "j"}}]}

    run(spec("sync", ("bqa", "bqa")), tmp_path / "sync", broker)
    sim.reset_stats()
    run(spec("batch", ("bqb", "bqb")), tmp_path / "batch", broker)
    stats = sim.stats()["bqb"]
    assert stats["requests"] == 0 and stats["batch"]["lines_answered"] == 5 * 2 + 5 * 2
    assert values(tmp_path / "batch") == values(tmp_path / "sync")
    line = next(v for (m, _), v in values(tmp_path / "batch").items() if m == "coherence")
    assert set(line["members"]) == {"j", "k"}
