"""Prometheus /metrics of real worker nodes (EVALQ_METRICS_PORT), scraped over HTTP while jobs
run on a private Redis with judge-sim as the judge: the counters equal what results.json and
run.json report for the same work, a prefork pool's children all count (also one that died),
the jobs role's gauges follow Redis and the history store, and a real Prometheus scrapes it.

Every test compares deltas (a scrape before, one after), so no test depends on another's work.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from evalq.cli.embedded import EmbeddedRedis, free_port
from evalq.cli.run import run_job
from evalq.shared.job.schema import parse_job
from evalq.sim import JudgeSim, Region
from tests.conftest import start_worker, stop_worker, wait_for_worker

pytestmark = pytest.mark.integration

SECRET = "sk-evalq-test-" + uuid.uuid4().hex
KEY_ENV = "TEST_METRICS_API_KEY"
JUDGE_REGIONS = ("ma", "mb")  # two deployments of one judge
MODEL_REGION = "mg"           # the model under test's deployment
TPM, RPM = 9_000_000, 90_000
# prices whose every call costs a whole number of billionths: sums are exact in both counts
PRICE = {"input_per_1k": 0.002, "output_per_1k": 0.004}
STALL_SECONDS = 3


class Node:
    def __init__(self, name: str, proc: subprocess.Popen, port: int):
        self.name, self.proc, self.port = name, proc, port

    def scrape(self) -> dict[tuple[str, tuple], float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    def children(self) -> list[int]:
        """The pool's processes (whichever thread of the node forked them)."""
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # gone meanwhile
            if int(fields[1]) == self.proc.pid:
                found.append(int(stat.parent.name))
        return sorted(found)


def total(samples: dict, sample: str, /, **labels: str) -> float:
    """The sum of the samples named ``sample`` whose labels include ``labels``."""
    return sum(v for (n, ls), v in samples.items() if n == sample and set(labels.items()) <= set(ls))


def delta(after: dict, before: dict, sample: str, /, **labels: str) -> float:
    return total(after, sample, **labels) - total(before, sample, **labels)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A Redis of this module's own (no other module's worker steals a chunk), judge-sim, and three
    nodes with /metrics: cpu (prefork, 2 children), judge and generation (threads), evalq.jobs."""
    os.environ[KEY_ENV] = SECRET
    tmp = tmp_path_factory.mktemp("metrics")
    (tmp / "redis").mkdir()
    server = EmbeddedRedis(tmp / "redis")
    server.start()
    sim = JudgeSim([Region(r) for r in (*JUDGE_REGIONS, MODEL_REGION)], latency=0.005, api_key=SECRET, seed=7)
    sim.start()
    history = f"sqlite:///{tmp / 'history.sqlite'}"
    env = {"EVALQ_HISTORY_URL": history, "EVALQ_STALL_SECONDS": str(STALL_SECONDS), KEY_ENV: SECRET,
           # the batch manager's timing, short for a test (defaults: settle 10 s, first poll 5 s)
           "EVALQ_BATCH_TICK": "0.1", "EVALQ_BATCH_SETTLE": "0.3", "EVALQ_BATCH_POLL": "0.2",
           "EVALQ_BATCH_POLL_MAX": "0.5"}
    queues = {"cpu": ("cpu", 2), "judge": (",".join(f"judge.{r}" for r in JUDGE_REGIONS) + f",generate.{MODEL_REGION}", 4),
              "jobs": ("evalq.jobs", 1)}
    nodes = {}
    for kind, (qs, concurrency) in queues.items():
        port, name = free_port(), f"m{kind}{uuid.uuid4().hex[:6]}"
        proc = start_worker(server.url, qs, tmp, concurrency=concurrency, name=name,
                            env={**env, "EVALQ_METRICS_PORT": str(port)})
        nodes[kind] = Node(name, proc, port)
    try:
        for node in nodes.values():
            wait_for_worker(server.url, node.name)
        yield {"url": server.url, "sim": sim, "nodes": nodes, "history": history, "tmp": tmp}
    finally:
        for node in nodes.values():
            stop_worker(node.proc)
        sim.stop()
        server.stop()
    for node in nodes.values():
        assert SECRET not in node.proc.log_path.read_text(errors="replace")


def run(cluster, job: dict, out: Path, chunk_size: int | None = None) -> list[dict]:
    run_job(parse_job(job), out, broker=cluster["url"], chunk_size=chunk_size, progress=False, stall_timeout=60)
    return json.loads((out / "results.json").read_text())


def scrape_all(cluster) -> dict:
    """Every node's samples, summed per (name, labels)."""
    out: dict = {}
    for node in cluster["nodes"].values():
        for key, value in node.scrape().items():
            out[key] = out.get(key, 0.0) + value
    return out


def endpoint(cluster, regions, sim_region: str | None = None, **extra) -> dict:
    """An endpoint on judge-sim; ``sim_region``: every deployment is answered by that one."""
    sim = cluster["sim"]
    return {"provider": "openai", "model": "judge-sim", "api_key_env": KEY_ENV, "max_tokens": 60,
            "max_retries": 2, "timeout": 5, "price": PRICE,
            "deployments": [{"region": r, "base_url": sim.base_url(sim_region or r), "tpm": TPM, "rpm": RPM}
                            for r in regions], **extra}


def cpu_job(n: int, suite: str) -> dict:
    """exact_match scores every item; fail_on fails those whose output says FAIL; slow_len
    takes long enough per chunk for both pool children to be given work."""
    instances = [{"id": f"i{i}", "input": f"q{i}", "expected-output": [f"a{i}"],
                  "actual-output": f"a{i}" if i % 3 else f"FAIL {i}"} for i in range(n)]
    return {"suite": suite, "instances": instances,
            "metrics": [{"id": "exact_match"}, {"id": "fail_on"},
                        {"id": "slow_len", "parameters": {"seconds": 0.03}}]}


def test_cpu_counters_equal_results_json_on_a_prefork_pool(cluster, tmp_path):
    cpu = cluster["nodes"]["cpu"]
    before, logged = cpu.scrape(), cpu.proc.log_path.stat().st_size
    results = {m["metric"]: m for m in run(cluster, cpu_job(40, f"metrics-{uuid.uuid4().hex[:8]}"), tmp_path,
                                           chunk_size=4)}
    after = cpu.scrape()
    n_fail = len([i for i in range(40) if i % 3 == 0])  # counted here, from the job itself
    assert results["fail_on"]["n_errors"] == n_fail and results["fail_on"]["n"] == 40 - n_fail
    for metric, res in results.items():
        assert delta(after, before, "evalq_items_scored_total", metric=metric, queue="cpu") == res["n"]
        assert delta(after, before, "evalq_item_errors_total", metric=metric) == res["n_errors"]
        assert delta(after, before, "evalq_items_skipped_total", metric=metric) == res.get("n_skipped", 0)
    assert delta(after, before, "evalq_items_scored_total") == 40 * 3 - n_fail
    # both pool children scored this job's chunks (Celery logs a task's end under its process's name)
    with open(cpu.proc.log_path, "rb") as f:
        f.seek(logged)
        log = f.read().decode(errors="replace")
    children = set(re.findall(r"INFO/(ForkPoolWorker-\d+)\] Task evalq\.score_chunk\[", log))
    assert len(children) == 2, children


def test_a_pool_child_that_dies_loses_no_counts(cluster, tmp_path):
    cpu = cluster["nodes"]["cpu"]
    run(cluster, cpu_job(12, "metrics-warmup"), tmp_path / "warm", chunk_size=2)
    before = cpu.scrape()
    counted = total(before, "evalq_items_scored_total")
    assert counted > 0
    victims = cpu.children()
    assert len(victims) == 2, victims
    os.kill(victims[0], signal.SIGKILL)  # no goodbye: its values are only in its file
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        now = cpu.children()
        if len(now) == 2 and victims[0] not in now:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the pool did not replace its child: {cpu.children()}")
    assert cpu.scrape() == before  # nothing lost, nothing added
    results = {m["metric"]: m for m in run(cluster, cpu_job(12, "metrics-after-kill"), tmp_path / "after",
                                           chunk_size=2)}
    after = cpu.scrape()
    assert delta(after, before, "evalq_items_scored_total") == sum(m["n"] for m in results.values())
    assert delta(after, before, "evalq_item_errors_total") == sum(m["n_errors"] for m in results.values())


def test_judge_and_generation_counters_equal_results_and_run_json(cluster, tmp_path):
    judge_node = cluster["nodes"]["judge"]
    tag = uuid.uuid4().hex
    n = 12
    # two items meet a 429 once (Retry-After 1 s): rate_limited counts them
    instances = [{"id": f"q{i}", "input": f"Question {i} {tag}?" + (" [[sim:429-once]]" if i in (3, 8) else "")}
                 for i in range(n)]
    job = {"instances": instances, "model": {**endpoint(cluster, [MODEL_REGION], max_tokens=40), "cache": False},
           "judges": {"sim": endpoint(cluster, JUDGE_REGIONS, output="text")}, "judging": {"cache": False},
           "metrics": [{"id": "fluency", "parameters": {"judge": "sim"}},
                       {"id": "coherence", "parameters": {"judge": "sim"}}]}
    before = judge_node.scrape()
    results = run(cluster, job, tmp_path, chunk_size=2)
    after = judge_node.scrape()
    run_json = json.loads((tmp_path / "run.json").read_text())
    gen = run_json["generation"]

    per_region: dict[str, dict[str, float]] = {}
    for entry in results:
        assert delta(after, before, "evalq_items_scored_total", metric=entry["metric"]) == entry["n"]
        assert delta(after, before, "evalq_item_errors_total", metric=entry["metric"]) == entry["n_errors"]
        for region, counts in entry["judge"]["regions"].items():
            for field, value in counts.items():
                per_region.setdefault(region, {}).setdefault(field, 0)
                per_region[region][field] += value
    for region, counts in gen["judge"]["regions"].items():
        for field, value in counts.items():
            per_region.setdefault(region, {}).setdefault(field, 0)
            per_region[region][field] += value
    assert set(per_region) == {*JUDGE_REGIONS, MODEL_REGION}  # every deployment answered
    assert delta(after, before, "evalq_items_scored_total", metric="generate",
                 queue=f"generate.{MODEL_REGION}") == n - gen["n_errors"]
    assert sum(c.get("rate_limited", 0) for c in per_region.values()) >= 2  # the 429s happened
    for region, counts in per_region.items():
        d = dict(deployment=region)
        assert delta(after, before, "evalq_judge_calls_total", **d) == counts["calls"]
        assert delta(after, before, "evalq_judge_tokens_total", kind="prompt", **d) == counts["prompt_tokens"]
        assert delta(after, before, "evalq_judge_tokens_total", kind="completion", **d) == counts["completion_tokens"]
        assert delta(after, before, "evalq_judge_rate_limited_total", **d) == counts.get("rate_limited", 0)
        assert delta(after, before, "evalq_judge_cost_total", **d) == pytest.approx(counts["cost"], abs=1e-9)
        # the price times the tokens, computed here
        assert counts["cost"] == pytest.approx((counts["prompt_tokens"] * PRICE["input_per_1k"]
                                                + counts["completion_tokens"] * PRICE["output_per_1k"]) / 1000,
                                               abs=1e-9)
        # admission reserves for every attempt; those answered reserved reserved_tokens
        assert delta(after, before, "evalq_budget_tokens_admitted_total", **d) >= counts["reserved_tokens"] > 0
        assert total(after, "evalq_budget_tpm", **d) == TPM and total(after, "evalq_budget_rpm", **d) == RPM
    assert delta(after, before, "evalq_judge_cost_total") == pytest.approx(
        sum(e["judge"]["cost"] for e in results) + gen["judge"]["cost"], abs=1e-9)
    assert delta(after, before, "evalq_judge_cost_total") == pytest.approx(run_json["cost"], abs=1e-9)


def test_batch_lines_count_by_outcome_and_in_the_totals(cluster, tmp_path):
    """A job judged through the Batch API: its lines are counted by outcome on the judge node (where
    the batch manager runs), and in the calls, tokens and cost as results.json reports them."""
    judge_node, region = cluster["nodes"]["judge"], JUDGE_REGIONS[0]
    config = endpoint(cluster, [region])
    config["deployments"][0]["batch"] = {"enqueued_tokens": 10_000_000}
    tag = uuid.uuid4().hex
    job = {"instances": [{"id": f"b{i}", "input": f"Question {i} {tag}?", "actual-output": f"Answer {i}."}
                         for i in range(6)],
           "judges": {"sim": config}, "judging": {"cache": False, "mode": "batch"},
           "metrics": [{"id": "fluency", "parameters": {"judge": "sim"}}]}
    before = judge_node.scrape()
    (entry,) = run(cluster, job, tmp_path)
    after = judge_node.scrape()
    judge, d = entry["judge"], dict(deployment=region)
    assert judge["by_path"]["batch"]["calls"] == judge["calls"] == 6 and judge["by_path"]["sync"]["calls"] == 0
    assert delta(after, before, "evalq_judge_batch_lines_total", outcome="answered", **d) == 6
    assert delta(after, before, "evalq_judge_batch_lines_total", outcome="failed", **d) == \
        judge["by_path"]["batch"]["failed_lines"]
    assert delta(after, before, "evalq_judge_calls_total", **d) == 6
    assert delta(after, before, "evalq_judge_tokens_total", kind="prompt", **d) == judge["prompt_tokens"] > 0
    assert delta(after, before, "evalq_judge_cost_total", **d) == pytest.approx(judge["cost"], abs=1e-9)
    assert judge["cost"] == pytest.approx((judge["prompt_tokens"] * PRICE["input_per_1k"]
                                           + judge["completion_tokens"] * PRICE["output_per_1k"]) / 2000, abs=1e-9)


def test_items_kept_by_a_deferred_chunk_count_once(cluster, tmp_path):
    """One request per 4 s window: the chunk's first item is scored (and kept), its second must
    wait past what a worker sleeps, so the chunk is deferred and run again for that item alone.
    The item the first run kept is written to results by the second run, and counted there."""
    judge_node = cluster["nodes"]["judge"]
    region = JUDGE_REGIONS[0]
    judge = endpoint(cluster, [region], output="text", model=f"judge-sim-{uuid.uuid4().hex[:6]}")
    judge["deployments"][0].update(rpm=1, window_seconds=4, burst_seconds=4)
    job = {"instances": [{"id": f"q{i}", "input": "q", "actual-output": f"answer {i}"} for i in range(2)],
           "judges": {"sim": judge}, "judging": {"cache": False},
           "metrics": [{"id": "fluency", "parameters": {"judge": "sim"}}]}
    before, logged = judge_node.scrape(), judge_node.proc.log_path.stat().st_size
    result = run(cluster, job, tmp_path, chunk_size=2)[0]
    after = judge_node.scrape()
    with open(judge_node.proc.log_path, "rb") as f:
        f.seek(logged)
        assert re.search(r"fluency\S*\[0:2\] deferred", f.read().decode(errors="replace")), "no deferral"
    assert (result["n"], result["judge"]["calls"]) == (2, 2)
    assert delta(after, before, "evalq_items_scored_total", metric="fluency", queue=f"judge.{region}") == 2
    assert delta(after, before, "evalq_judge_calls_total", deployment=region) == 2


def test_cache_hits_count_under_the_cache_deployment(cluster, tmp_path):
    judge_node = cluster["nodes"]["judge"]
    tag = uuid.uuid4().hex
    job = {"instances": [{"id": f"q{i}", "input": "q", "actual-output": f"{tag} {i}"} for i in range(6)],
           "judges": {"sim": endpoint(cluster, JUDGE_REGIONS[:1], output="text")},
           "metrics": [{"id": "fluency", "parameters": {"judge": "sim"}}]}
    run(cluster, job, tmp_path / "first")
    before = judge_node.scrape()
    second = run(cluster, job, tmp_path / "second")[0]["judge"]
    after = judge_node.scrape()
    assert second["cache_hits"] == 6 and second["calls"] == 0
    assert delta(after, before, "evalq_judge_cache_hits_total", deployment="cache") == second["cache_hits"]
    assert delta(after, before, "evalq_judge_calls_total") == 0


def test_jobs_role_counts_jobs_stalls_and_backlog(cluster, tmp_path):
    from evalq.orchestrator import submit as submitting
    from evalq.orchestrator.jobs import cancel_job, recent

    jobs_node = cluster["nodes"]["jobs"]
    r = redis.Redis.from_url(cluster["url"])
    # a judge queue no worker consumes: the job waits there, its chunks the queue's backlog
    idle_region, n, chunk = "mz", 10, 2
    job = {"suite": f"metrics-stuck-{uuid.uuid4().hex[:6]}",
           "instances": [{"id": f"q{i}", "input": "q", "actual-output": f"a {i}"} for i in range(n)],
           "judges": {"sim": endpoint(cluster, [idle_region], JUDGE_REGIONS[0], output="text")},
           "metrics": [{"id": "fluency", "parameters": {"judge": "sim"}}]}
    job_id = submitting.submit(r, cluster["url"], parse_job(job), chunk, out=str(tmp_path))
    try:
        # submitted_at is in whole seconds: up to 1 s has passed, less than the stall time
        assert total(jobs_node.scrape(), "evalq_jobs_stalled") == 0
        deadline = time.monotonic() + STALL_SECONDS + 15
        while True:
            samples = jobs_node.scrape()
            if total(samples, "evalq_jobs_stalled") >= 1 or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        statuses = [row["status"] for row in recent(r, 1000)]
        for status in ("running", "done", "cancelled"):
            assert total(samples, "evalq_jobs", status=status) == statuses.count(status), status
        assert statuses.count("running") == 1  # this one
        assert total(samples, "evalq_jobs_stalled") == 1
        assert total(samples, "evalq_queue_backlog", queue=f"judge.{idle_region}") == n // chunk
        # the other nodes serve no jobs-role gauges
        assert not any(name == "evalq_jobs" for name, _ in cluster["nodes"]["cpu"].scrape())
    finally:
        assert cancel_job(r, cluster["url"], job_id) == "cancelled"
    samples = jobs_node.scrape()
    assert total(samples, "evalq_jobs_stalled") == 0
    assert total(samples, "evalq_jobs", status="cancelled") == [row["status"] for row in recent(r, 1000)].count(
        "cancelled") >= 1


def test_suite_gauges_show_the_last_run_from_the_history_store(cluster, tmp_path):
    suite = f"metrics-suite-{uuid.uuid4().hex[:8]}"
    started = time.time()
    results = {m["metric"]: m for m in run(cluster, cpu_job(9, suite), tmp_path, chunk_size=3)}
    samples = cluster["nodes"]["jobs"].scrape()
    exact = results["exact_match"]["score"]
    expected = exact["mean"] if isinstance(exact, dict) else exact
    assert expected == pytest.approx(6 / 9)  # the job's own answers: i % 3 != 0 match
    assert total(samples, "evalq_suite_value", suite=suite, metric="exact_match", name="exact_match",
                 field="mean") == pytest.approx(expected)
    assert total(samples, "evalq_suite_regressions", suite=suite) == 0
    at = total(samples, "evalq_suite_last_run_timestamp_seconds", suite=suite, status="done")
    assert started - 1 <= at <= time.time() + 1
    assert not [k for k in samples if k[0] == "evalq_suite_cost" and ("suite", suite) in k[1]]  # no price


def test_a_real_prometheus_scrapes_the_nodes(cluster, tmp_path):
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus is not installed (Debian: apt-get install prometheus)")
    run(cluster, cpu_job(6, "metrics-prometheus"), tmp_path / "out", chunk_size=3)
    expected = total(scrape_all(cluster), "evalq_items_scored_total")
    assert expected > 0
    port = free_port()
    targets = ", ".join(f'"127.0.0.1:{node.port}"' for node in cluster["nodes"].values())
    config = tmp_path / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                      f"scrape_configs:\n  - job_name: evalq\n    static_configs:\n      - targets: [{targets}]\n")
    with open(tmp_path / "prometheus.log", "wb") as log:
        proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        query = urllib.parse.urlencode({"query": "sum(evalq_items_scored_total)"})
        deadline, got = time.monotonic() + 30, None
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/query?{query}", timeout=5) as reply:
                    answer = json.loads(reply.read())
                found = answer["data"]["result"]
                got = float(found[0]["value"][1]) if found else None
                if got == expected:
                    break
            except OSError:
                pass  # not listening yet
            time.sleep(0.5)
        assert got == expected
        # the jobs role's gauges too, labels and all (each target is scraped on its own schedule:
        # the jobs node's first scrape may come after the other nodes')
        query = urllib.parse.urlencode({"query": 'evalq_jobs{status="done"}'})
        want = [total(cluster["nodes"]["jobs"].scrape(), "evalq_jobs", status="done")]
        deadline, rows = time.monotonic() + 30, None
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/query?{query}", timeout=5) as reply:
                rows = [float(row["value"][1]) for row in json.loads(reply.read())["data"]["result"]]
            if rows:
                break
            time.sleep(0.5)
        assert rows == want
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
