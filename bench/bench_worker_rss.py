"""Peak RSS of worker processes, for Kubernetes requests and limits.

A cpu worker (prefork, 2 processes) scores N instances with bleu, rouge and
f1_score, and a judge worker (threads, 16) scores M instances with coherence and
content_safety against judge-sim; the jobs role (evalq.jobs) takes the requests
and runs the callbacks. Each worker's process tree (main process and pool
children) is sampled every 50 ms; the peak of the tree's summed RSS is printed
beside the same figure for an idle worker of the same kind, measured in this run.

    .venv/bin/python bench/bench_worker_rss.py [--n 50000] [--m 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("EVALQ_ENDPOINTS", "*=http://127.0.0.1:*")

from evalq.cli.embedded import EmbeddedRedis  # noqa: E402
from evalq.sim import JudgeSim, Region  # noqa: E402

KEY_ENV = "BENCH_RSS_API_KEY"


def tree_rss(pid: int) -> int:
    try:
        proc = psutil.Process(pid)
        return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)])
    except psutil.Error:
        return 0


class Sampler(threading.Thread):
    def __init__(self, pids: dict[str, int]):
        super().__init__(daemon=True)
        self.pids, self.peak, self.stop = pids, dict.fromkeys(pids, 0), threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for name, pid in self.pids.items():
                self.peak[name] = max(self.peak[name], tree_rss(pid))
            time.sleep(0.05)


def start(url: str, queues: str, concurrency: int, name: str, logdir: Path) -> subprocess.Popen:
    log = open(logdir / f"{name}.log", "wb")
    return subprocess.Popen([sys.executable, "-m", "evalq.cli", "worker", "--queues", queues,
                             "--concurrency", str(concurrency), "-n", f"{name}@%h", "-l", "WARNING",
                             *(["--no-control"] if queues != "evalq.jobs" else [])],
                            cwd=ROOT, env={**os.environ, "EVALQ_BROKER_URL": url, KEY_ENV: "bench"},
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50_000, help="instances for the cpu job")
    parser.add_argument("--m", type=int, default=2_000, help="instances for the judge job")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="evalq-bench-rss-"))
    (work / "redis").mkdir()
    redis = EmbeddedRedis(work / "redis", persist=False)
    redis.start()
    procs: dict[str, subprocess.Popen] = {}
    try:
        with JudgeSim([Region("lab")], latency=0.01, seed=0) as sim:
            procs = {"jobs": start(redis.url, "evalq.jobs", 2, "jobs", work),
                     "cpu": start(redis.url, "cpu", 2, "cpu", work),
                     "judge": start(redis.url, "judge.lab", 16, "judge", work)}
            time.sleep(8)  # started and idle
            idle = {name: tree_rss(p.pid) for name, p in procs.items()}
            sampler = Sampler({name: p.pid for name, p in procs.items()})
            sampler.start()
            cpu_job = {"instances": [{"id": f"c{i}", "actual-output": f"the cat number {i} sat on the warm mat",
                                      "expected-output": [f"a cat {i} sat on the mat", "the cat sat"]}
                                     for i in range(args.n)],
                       "metrics": [{"id": "bleu"}, {"id": "rouge"}, {"id": "f1_score"}]}
            judge_job = {"instances": [{"id": f"j{i}", "input": f"Question {i}?", "actual-output": f"Answer {i}."}
                                       for i in range(args.m)],
                         "judges": {"sim": {"provider": "openai", "model": "judge-sim", "api_key_env": KEY_ENV,
                                            "deployments": [{"region": "lab", "base_url": sim.base_url("lab"),
                                                             "tpm": 50_000_000, "rpm": 1_000_000}]}},
                         "judging": {"cache": False},
                         "metrics": [{"id": "coherence", "parameters": {"judge": "sim"}},
                                     {"id": "content_safety", "parameters": {"judge": "sim"}}]}
            evalq = [sys.executable, "-m", "evalq.cli"]
            env = {**os.environ, "EVALQ_BROKER_URL": redis.url, KEY_ENV: "bench"}
            for name, job in (("cpu", cpu_job), ("judge", judge_job)):
                path = work / f"{name}.json"
                path.write_text(json.dumps(job))
                t0 = time.perf_counter()
                job_id = subprocess.run([*evalq, "submit", str(path), "--out", str(work / f"out-{name}")],
                                        env=env, capture_output=True, text=True, check=True).stdout.strip()
                subprocess.run([*evalq, "wait", job_id], env=env, check=True, capture_output=True)
                print(f"{name} job: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            sampler.stop.set()
            sampler.join()
    finally:
        for p in procs.values():
            try:
                os.killpg(p.pid, 9)
            except ProcessLookupError:
                pass
        redis.stop()
    print(f"cpu job: {args.n:,} instances x bleu, rouge, f1_score; judge job: {args.m:,} instances x coherence, "
          "content_safety (judge-sim)")
    print(f"{'worker (process tree)':38} {'idle RSS':>10} {'peak RSS':>10}")
    for name, label in (("jobs", "jobs role (evalq.jobs, 2 processes)"), ("cpu", "cpu (prefork, 2 processes)"),
                        ("judge", "judge (threads, 16)")):
        print(f"{label:38} {idle[name] / 2**20:8.0f} MiB {sampler.peak[name] / 2**20:8.0f} MiB")


if __name__ == "__main__":
    main()
