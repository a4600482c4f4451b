"""Nightly operations end to end: jobs sent as queue messages to a real cluster (Redis,
a jobs + cpu worker) are recorded by the final callback in a real PostgreSQL history
store; the third night regresses on one metric and exactly one alert reaches a webhook
listening on 127.0.0.1. ``evalq history`` reads the store as a user would. An embedded
``evalq run`` records into the default SQLite store."""

from __future__ import annotations

import json
import uuid

import pytest
import redis

from tests.conftest import WebhookListener, evalq, running_worker
from tests.integration.test_jobs_service import await_reply, send

pytestmark = pytest.mark.integration

N = 40
REFERENCE = "the cat sat on the mat"


def night(answers_right: set[int]) -> dict:
    """A night's job: exact_match is 1 where an instance's answer is right; slow_len (the
    answer's length) is the same every night."""
    instances = [{"id": f"q{k}", "input": "?", "expected-output": [REFERENCE],
                  "actual-output": REFERENCE if k in answers_right else "the cat sat on the hat"}
                 for k in range(N)]
    return {"instances": instances, "metrics": [{"id": "exact_match"}, {"id": "slow_len", "parameters": {"seconds": 0}}]}


GOOD = {k for k in range(N) if k % 5}        # 32 of 40 right: 0.8
WORSE = {k for k in range(N) if k % 5 in (1, 2)}  # 16 of 40, each one right before: 0.4


@pytest.fixture(scope="module")
def hook():
    listener = WebhookListener()
    yield listener
    listener.stop()


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    """A Redis of this module's own: every final callback runs on this module's worker (one
    that consumes the control queue without EVALQ_HISTORY_URL would record elsewhere)."""
    from evalq.cli.embedded import EmbeddedRedis

    server = EmbeddedRedis(tmp_path_factory.mktemp("history-redis"))
    server.start()
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def cluster(redis_url, postgres_url, hook, tmp_path_factory):
    yield from running_worker(redis_url, "evalq.jobs,cpu", tmp_path_factory.mktemp("history-workers"), "hist",
                              env={"EVALQ_HISTORY_URL": postgres_url, "EVALQ_ALERT_WEBHOOK": hook.url,
                                   "EVALQ_REQUEST_ROOTS": str(tmp_path_factory.getbasetemp())})


def test_three_nights_one_regression_one_alert(redis_url, postgres_url, cluster, hook, tmp_path):
    r = redis.Redis.from_url(redis_url)
    suite = f"nightly-{uuid.uuid4().hex[:6]}"
    jobs, outs = [], []
    for n, right in enumerate((GOOD, GOOD, WORSE)):
        reply_to, out = f"replies:{uuid.uuid4().hex}", tmp_path / f"night{n}"
        send(redis_url, job=night(right), out=str(out), request_id=f"{suite}-{n}", reply_to=reply_to, suite=suite)
        doc = await_reply(r, reply_to)
        assert doc["status"] == "done", doc
        jobs.append(doc["job_id"])
        outs.append(json.loads((out / "results.json").read_text()))
        # the alert (if any) is sent before the job ends: what arrived so far is final for this night
        assert len(hook.bodies) == (1 if n == 2 else 0)

    shown = evalq("history", suite, "--json", env={"EVALQ_HISTORY_URL": postgres_url})
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    assert doc["suite"] == suite and [run["job_id"] for run in doc["runs"]] == jobs  # oldest first
    for run, results, right in zip(doc["runs"], outs, (GOOD, GOOD, WORSE)):
        assert run["status"] == "done" and run["request_id"].startswith(suite)
        values = {m["name"]: m for m in run["metrics"]}
        assert values["exact_match"]["value"] == pytest.approx(len(right) / N)  # counted here, independently
        assert values["exact_match"]["value"] == pytest.approx(results[0]["score"])
        assert values["exact_match"]["ci95"] == pytest.approx(results[0]["ci95"])
        assert values["exact_match"]["n"] == N == results[0]["n"]
        assert values["slow_len"]["value"] == pytest.approx(len(REFERENCE))
    assert [len(run["regressions"]) for run in doc["runs"]] == [0, 0, 1]
    [found] = doc["runs"][2]["regressions"]
    assert found["metric"] == "exact_match" and found["paired"] and found["delta"] == pytest.approx(-0.4)
    assert found["baseline"] == pytest.approx(0.8) and found["p_value"] < 0.05

    # the outputs say it too (issue 74): results.json's entry, run.json, report.html's header and section
    assert outs[2][0]["regressions"] == [{k: found[k] for k in ("field", "value", "baseline", "delta", "p_value",
                                                                "paired", "n", "baseline_runs")}]
    assert found["baseline_runs"] == 2 and "regressions" not in outs[2][1] and "regressions" not in outs[1][0]
    said = [json.loads((tmp_path / f"night{n}" / "run.json").read_text())["regressions"] for n in range(3)]
    moved = [s.pop("dataset") for s in said]  # the nights' answers differ, their test cases do not: one version
    assert len({m["digest"] for m in moved}) == 1 and [m["n"] for m in moved] == [N] * 3
    assert [m.get("compared_on") for m in moved] == [None, "same version", "same version"]
    assert said == [{"suite": suite, "found": 0, "baseline_runs": 0}, {"suite": suite, "found": 0, "baseline_runs": 1},
                    {"suite": suite, "found": 1, "baseline_runs": 2}]
    from evalq.results.markup import esc

    pages = [(tmp_path / f"night{n}" / "report.html").read_text() for n in range(3)]
    assert f"<th>regressions</th><td>none: no earlier run of suite {suite} that ended done" in pages[0]
    assert f"<th>regressions</th><td>none against the suite{esc(chr(39))}s baseline (1 earlier run of {suite})" in pages[1]
    assert (f"<th>regressions</th><td>1 against the suite{esc(chr(39))}s baseline (2 earlier runs of {suite}): "
            f"exact_match 0.4 vs 0.8 (-0.4); evalq history {suite} lists them") in pages[2]
    assert "<p class=fail>REGRESSION exact_match 0.4000 vs baseline 0.8000 (-0.4000" in pages[2]

    [alert] = hook.bodies
    assert alert["suite"] == suite and alert["job_id"] == jobs[2]
    assert [f["name"] for f in alert["regressions"]] == ["exact_match"]
    assert "exact_match" in alert["text"] and "slow_len" not in alert["text"]
    assert "SECRET-TOKEN" not in cluster.log_path.read_text()

    listed = evalq("history", "--json", env={"EVALQ_HISTORY_URL": postgres_url})
    mine = [s for s in json.loads(listed.stdout)["suites"] if s["suite"] == suite]
    assert mine and mine[0]["runs"] == 3 and mine[0]["last"]["regressions"] == 1


def test_a_failed_job_is_recorded_too(redis_url, postgres_url, cluster, tmp_path):
    """A job whose outputs cannot be written where it asked ends failed (they go to the
    fallback directory), and is in the history as failed, with the reason."""
    import shutil
    import time

    r = redis.Redis.from_url(redis_url)
    suite = f"broken-{uuid.uuid4().hex[:6]}"
    out = tmp_path / "out"
    reply_to = f"replies:{uuid.uuid4().hex}"
    job = night(GOOD)
    job["metrics"] = [{"id": "slow_len", "parameters": {"seconds": 0.1}}]
    send(redis_url, job=job, out=str(out), reply_to=reply_to, suite=suite)
    deadline = time.monotonic() + 30
    while not out.is_dir() and time.monotonic() < deadline:  # checked (made) when the request is read
        time.sleep(0.05)
    shutil.rmtree(out)
    out.write_text("now a file: the outputs cannot go here")
    doc = await_reply(r, reply_to)
    assert doc["status"] == "failed", doc
    shown = evalq("history", suite, "--json", env={"EVALQ_HISTORY_URL": postgres_url})
    assert shown.returncode == 0, shown.stderr
    [run] = json.loads(shown.stdout)["runs"]
    assert run["job_id"] == doc["job_id"] and run["status"] == "failed" and "writing to" in run["error"]
    assert run["regressions"] == [] and run["metrics"][0]["n"] == N


def test_an_embedded_run_records_in_the_default_store(tmp_path):
    job = tmp_path / "translation-suite.json"
    job.write_text(json.dumps(night(GOOD)))
    env = {"EVALQ_CACHE_DIR": str(tmp_path / "cache")}
    ran = evalq("run", str(job), "--out", str(tmp_path / "out"), "-q", env=env)
    assert ran.returncode == 0, ran.stderr
    assert (tmp_path / "cache" / "history.sqlite").exists()
    text = evalq("history", "translation-suite", env=env)
    assert text.returncode == 0 and "exact_match" in text.stdout and "0.8000" in text.stdout
    page = evalq("history", "translation-suite", "--html", str(tmp_path / "h.html"), env=env)
    assert page.returncode == 0 and "<svg" in (tmp_path / "h.html").read_text()
    # a worse night says so where it is watched: on evalq run's stderr, with the command that lists it
    job.write_text(json.dumps(night(WORSE)))
    worse = evalq("run", str(job), "--out", str(tmp_path / "worse"), "-q", env=env)
    assert worse.returncode == 0, worse.stderr
    assert ("1 regression(s) against the suite's baseline (evalq history translation-suite lists them"
            in worse.stderr)
    # the dataset moves (issue 75): 5 instances added, 2 reworded; tonight's answers are all right, so
    # a mean over every item would be no worse either way: the night is compared on the 38 items shared
    # unchanged, and says how its data moved where it is watched
    moved = night(GOOD)
    moved["instances"] = [{**i, "input": "? (reworded)"} if i["id"] in ("q1", "q2") else i for i in moved["instances"]]
    moved["instances"] += [{"id": f"q{k}", "input": "?", "expected-output": [REFERENCE], "actual-output": REFERENCE}
                           for k in range(N, N + 5)]
    job.write_text(json.dumps(moved))
    ran = evalq("run", str(job), "--out", str(tmp_path / "moved"), "-q", env=env)
    assert ran.returncode == 0, ran.stderr
    said = json.loads((tmp_path / "moved" / "run.json").read_text())["regressions"]["dataset"]
    assert (said["n"], said["added"], said["removed"], said["changed"], said["shared"]) == (N + 5, 5, 0, 2, N - 2)
    assert said["compared_on"] == "shared items" and said["examples"]["changed"] == ["q1", "q2"]
    assert said["baseline"]["job_id"] == json.loads((tmp_path / "worse" / "run.json").read_text())["job_id"]
    assert f"against the baseline's ({N} instances" in ran.stderr and "5 added, 0 removed, 2 changed" in ran.stderr
    assert "<th>dataset</th><td>45 instances, version" in (tmp_path / "moved" / "report.html").read_text()
    before = json.loads((tmp_path / "worse" / "run.json").read_text())["regressions"]["dataset"]
    assert before["compared_on"] == "same version" and before["digest"] == said["baseline"]["digest"] != said["digest"]
    assert "dataset:" not in worse.stderr  # the same data as its baseline's: nothing to say
    shown = evalq("history", "translation-suite", env=env)
    assert shown.returncode == 0 and said["digest"][:12] in shown.stdout
    assert [line for line in shown.stdout.splitlines() if line.startswith("DATASET")][0].endswith(
        "regressions judged on the 38 items shared unchanged (added: q40, q41, q42, q43, q44; changed: q1, q2)")
    missing = evalq("history", "translation-suit", env=env)
    assert missing.returncode == 2 and "did you mean 'translation-suite'" in missing.stderr
    assert "Traceback" not in missing.stderr
