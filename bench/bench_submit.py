"""Planning and submitting a million-instance judge job in bounded memory.

A JSON Lines dataset of N instances (default 1,000,000) scored by one judge
metric (``coherence``, 4 items per task: N/4 tasks) is submitted with
``evalq submit`` to a broker with no workers, then cancelled. Prints the wall
time and peak RSS of the submitting process, and, measured in the same run,
what the former design held in memory before sending anything: the stage as
one Celery chord (N/4 task signatures in the orchestrator's memory). Goal:
submission under 300 MiB peak RSS.

    .venv/bin/python bench/bench_submit.py [--n 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evalq.cli.embedded import EmbeddedRedis  # noqa: E402

KEY_ENV = "BENCH_SUBMIT_API_KEY"

CHORD = """
import resource, sys, time
from celery import Celery, chord, signature
n = int(sys.argv[1])
app = Celery("evalq", set_as_current=False)
t0 = time.perf_counter()
header = [signature("evalq.score_chunk", args=("0123456789abcdef", "coherence@0", s, min(s + 4, n)),
                    kwargs={"deployment": "eastus2"}, app=app).set(queue="judge.eastus2")
          for s in range(0, n, 4)]
c = chord(header, signature("evalq.finalize", args=("0123456789abcdef",), app=app))
c.freeze()  # task ids, as apply_async assigns before sending
print(time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


WRAP = """
import json, resource, subprocess, sys
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)
print(json.dumps({"rc": proc.returncode, "out": proc.stdout, "err": proc.stderr,
                  "rss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def child_peak(cmd: list[str], env: dict) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MiB, stdout) of one command, measured by a wrapper process of its own."""
    t0 = time.perf_counter()
    wrapped = subprocess.run([sys.executable, "-c", WRAP, *cmd], cwd=ROOT, env=env, capture_output=True,
                             text=True, check=True)
    wall = time.perf_counter() - t0
    result = json.loads(wrapped.stdout)
    if result["rc"] != 0:
        sys.exit(f"{' '.join(cmd[2:5])} failed:\n{result['err']}")
    return wall, result["rss"], result["out"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="instances")
    args = parser.parse_args()
    n = args.n
    work = Path(tempfile.mkdtemp(prefix="evalq-bench-submit-"))
    data = work / "data.jsonl"
    with open(data, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"q{i:07d}", "question": f"What is item {i}?",
                                "answer": f"Item {i} is a synthetic answer of modest length."}) + "\n")
    job = {"dataset": {"uri": str(data), "format": "jsonl",
                       "data_config": {"model_input_location": "question", "model_output_location": "answer"}},
           "judges": {"j": {"provider": "openai", "model": "judge", "api_key_env": KEY_ENV,
                            "deployments": [{"region": "eastus2", "base_url": "http://127.0.0.1:9/v1",
                                             "tpm": 1_000_000, "rpm": 10_000}]}},
           "metrics": [{"id": "coherence", "parameters": {"judge": "j"}}]}
    job_file = work / "job.json"
    job_file.write_text(json.dumps(job))
    env = {**os.environ, KEY_ENV: "not-a-real-key"}
    evalq = [sys.executable, "-m", "evalq.cli"]

    chord_out = subprocess.run([sys.executable, "-c", CHORD, str(n)], capture_output=True, text=True, check=True)
    chord_s, chord_rss = map(float, chord_out.stdout.split())

    redis = EmbeddedRedis(work / "redis", persist=False)
    (work / "redis").mkdir()
    redis.start()
    try:
        val_s, val_rss, _ = child_peak([*evalq, "validate", str(job_file)], env)
        sub_s, sub_rss, out = child_peak([*evalq, "submit", str(job_file), "--out", str(work / "out"),
                                          "--broker", redis.url], env)
        job_id = out.strip()
        import redis as redis_py

        r = redis_py.Redis.from_url(redis.url)
        queued = r.llen("judge.eastus2")
        used = r.info("memory")["used_memory"] / 2**20
        t0 = time.perf_counter()
        subprocess.run([*evalq, "cancel", job_id, "--broker", redis.url], cwd=ROOT, env=env, check=True,
                       capture_output=True)
        cancel_s = time.perf_counter() - t0
    finally:
        redis.stop()
    print(f"N = {n:,} instances x coherence (4 items/task) = {queued:,} tasks queued, no workers")
    print(f"{'':48} {'wall':>9} {'peak RSS':>10}")
    print(f"{'evalq validate (dataset streamed, checked)':48} {val_s:8.1f}s {val_rss:8.1f} MiB")
    print(f"{'evalq submit (validate, store, plan, send)':48} {sub_s:8.1f}s {sub_rss:8.1f} MiB")
    print(f"{'former design: the stage as one chord, unsent':48} {chord_s:8.1f}s {chord_rss:8.1f} MiB")
    print(f"submission rate: {queued / sub_s:,.0f} tasks/s; Redis used {used:,.0f} MiB; cancel {cancel_s:.1f}s")
    print(f"goal: submit peak RSS < 300 MiB: {'met' if sub_rss < 300 else 'NOT met'}")


if __name__ == "__main__":
    main()
