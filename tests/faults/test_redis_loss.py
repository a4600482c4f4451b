"""The night survives its Redis (issue 72), as an operator meets it: a loopback cluster (a Redis
without persistence, a jobs and cpu worker, a judge worker, ``EVALQ_STORE`` a shared folder)
runs a job of bleu and coherence against judge-sim while a client waits with ``evalq run --broker``;
Redis is flushed at a seeded point of the judging. The client says the state was lost and rebuilt,
exits 0, and every (instance, entry) is there once with the value it must have (nltk's BLEU computed
directly; judge-sim's score as the item asks it); judge calls paid again are at most those of the
judge chunks in flight at the loss."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest
import redis
from nltk.tokenize import wordpunct_tokenize
from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

from evalq.sim import JudgeSim, Region
from tests.conftest import ROOT, read_log, start_worker, stop_worker, wait_for_worker
from tests.faults.test_faults import KEY, KEY_ENV, judge_job, private_redis, wait_until

pytestmark = pytest.mark.integration

THREADS = 4
JUDGE_CHUNK = 4  # a judge entry's chunk size (evalq.shared.metrics.registry)


def test_redis_flushed_mid_job_is_rebuilt_from_the_store_and_the_run_ends_as_undisturbed(tmp_path):
    n = 48
    server, port = private_redis(tmp_path, aof=False)
    url = f"redis://127.0.0.1:{port}/0"
    env = {KEY_ENV: KEY, "EVALQ_STORE": str(tmp_path / "store"), "EVALQ_SWEEP_INTERVAL": "1",
           "EVALQ_RESUME_AFTER": "5", "EVALQ_CALLBACK_GRACE": "3", "EVALQ_VISIBILITY_TIMEOUT": "8"}
    workers = []
    with JudgeSim([Region("loss")], latency=0.1, api_key=KEY, seed=72, per_request=True) as sim:
        path = judge_job(tmp_path, sim, "loss", "c", n, max_retries=0, timeout=30, rpm=1_000_000)
        job = json.loads(path.read_text())
        for i, inst in enumerate(job["instances"]):
            inst["expected-output"] = [f"a{i} the reference answer"]
        job["metrics"] = [{"id": "bleu", "parameters": {"smoothing_function": "method1"}}] + job["metrics"]
        path.write_text(json.dumps(job))
        try:
            for queues, concurrency, name in (("evalq.jobs,cpu", 1, "jobs"), ("judge.loss", THREADS, "judge")):
                workers.append(start_worker(url, queues, tmp_path, concurrency=concurrency, name=name, env=env))
            for name in ("jobs", "judge"):
                wait_for_worker(url, name, timeout=60)
            waiting = subprocess.Popen([sys.executable, "-m", "evalq.cli", "run", str(path), "--out",
                                        str(tmp_path / "out"), "--broker", url, "-q", "--stall-timeout", "120"],
                                       cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
            point = random.Random(72).uniform(0.2, 0.8)
            wait_until(lambda: sum(sim.answered("loss").values()) >= point * n, 120, f"{point:.0%} of the judging")
            before = sim.stats("loss")
            redis.Redis(port=port).flushall()  # what a Redis restarted without persistence leaves
            in_flight = sim.stats("loss")["requests"] - (before["requests"] - before["in_flight"])
            _, err = waiting.communicate(timeout=240)
            assert waiting.returncode == 0 and "Traceback" not in err, err
            # said whether the client looked while the state was gone or only after the rebuild
            assert "lost the job's state" in err and "rebuilt from the job store; going on" in err, err
        finally:
            for proc in workers:
                stop_worker(proc)
            server.terminate()
            server.wait(10)
        answered = sim.answered("loss")

    # every (instance, entry) once, with the value it must have
    log = read_log(tmp_path / "out")
    assert len({(line["instance_id"], line["metric"]) for line in log}) == len(log) == 2 * n
    by_id = {inst["id"]: inst for inst in job["instances"]}
    bleu = {line["instance_id"]: line["result"] for line in log if line["metric"] == "bleu"}
    assert bleu == pytest.approx({iid: sentence_bleu([wordpunct_tokenize(r) for r in inst["expected-output"]],
                                                     wordpunct_tokenize(inst["actual-output"]),
                                                     smoothing_function=SmoothingFunction().method1)
                                  for iid, inst in by_id.items()})
    assert {line["instance_id"]: line["result"]["score"] for line in log if line["metric"] == "coherence"} == \
        {f"c{i}": 1 + i % 5 for i in range(n)}
    # paid again: at most the calls of the judge chunks in flight at the loss (their items not yet in a part)
    repaid = sum(count - 1 for count in answered.values())
    bound = THREADS * JUDGE_CHUNK + in_flight
    print(f"redis flushed at {point:.0%} of the judging: {repaid} calls paid again (bound {bound})")
    assert len(answered) == n and repaid <= bound
