"""Trajectory metrics at nightly scale: N agent runs of 10 tool calls each (OpenAI chat logs, the
openai_chat preset), scored by trajectory and tool_call_f1, distributed (`evalq run` in embedded
mode: private Redis, local cpu workers, outputs written) against a single-process loop calling the
same metric functions on the same instances, in the same run.

    .venv/bin/python bench/bench_trajectory.py [--n 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TOOLS = ["search", "weather", "book", "email", "calendar", "translate"]
METRICS = [{"id": "trajectory"}, {"id": "tool_call_f1"}]


def tools() -> list[dict]:
    return [{"type": "function", "function": {"name": t, "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}}, "required": ["q"]}}}
        for t in TOOLS]


def runs(n: int, seed: int = 3) -> list[dict]:
    """Agent runs of 10 calls; the expected trajectory differs in a call or two (dropped, swapped,
    another argument) for most."""
    rng = random.Random(seed)
    defined = tools()
    out = []
    for i in range(n):
        expected = [{"name": rng.choice(TOOLS), "arguments": {"q": f"w{rng.randint(0, 50)}", "n": rng.randint(1, 5)}}
                    for _ in range(10)]
        made = [dict(c) for c in expected]
        if rng.random() < 0.5:
            made.pop(rng.randrange(len(made)))
        if rng.random() < 0.5:
            a, b = rng.randrange(len(made)), rng.randrange(len(made))
            made[a], made[b] = made[b], made[a]
        if rng.random() < 0.3:
            made[0] = {"name": made[0]["name"], "arguments": {"q": "other"}}
        messages = [{"role": "user", "content": f"task {i}"}]
        for k, c in enumerate(made):
            messages.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{k}", "type": "function",
                 "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}]})
            messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": "ok"})
        messages.append({"role": "assistant", "content": "done"})
        out.append({"id": str(i), "messages": messages, "tools": defined, "expected_tool_calls": expected})
    return out


def in_process(records: list[dict]) -> float:
    import evalq.shared.job.catalogue  # noqa: F401
    from evalq.shared.metrics.registry import REGISTRY

    instances = [{"id": r["id"], "messages": r["messages"], "tool_definitions": r["tools"],
                  "expected_tool_calls": r["expected_tool_calls"]} for r in records]
    fns = [(REGISTRY.get(m["id"]).load(), REGISTRY.get(m["id"]).params()) for m in METRICS]
    t0 = time.perf_counter()
    for inst in instances:
        for fn, params in fns:
            fn(inst, params)
    return time.perf_counter() - t0


def in_process_whole(data: Path, out: Path, parse_once: bool = False) -> float:
    """The same work as the run, in one process: read the JSON Lines, score, write a log. With
    ``parse_once`` each run's calls are parsed once for both metrics, as evalq's workers do
    (``evalq.shared.core.memo``): the best this loop can do."""
    from contextlib import nullcontext

    import evalq.shared.job.catalogue  # noqa: F401
    from evalq.shared.core.memo import shared_reading
    from evalq.shared.metrics.registry import REGISTRY

    fns = [(m["id"], REGISTRY.get(m["id"]).load(), REGISTRY.get(m["id"]).params()) for m in METRICS]
    t0 = time.perf_counter()
    with open(data) as f, open(out, "w") as log:
        for line in f:
            r = json.loads(line)
            inst = {"id": r["id"], "messages": r["messages"], "tool_definitions": r["tools"],
                    "expected_tool_calls": r["expected_tool_calls"]}
            with shared_reading() if parse_once else nullcontext():
                for name, fn, params in fns:
                    log.write(json.dumps({"instance_id": inst["id"], "metric": name,
                                          "result": fn(inst, params)}) + "\n")
    return time.perf_counter() - t0


def evalq_run(job: Path, out: Path, concurrency: int | None) -> tuple[float, float]:
    """(whole run, cluster part): the cluster part is run.json's wall time (submission to outputs);
    the rest is reading, validating and storing the dataset in the submitting process."""
    extra = ["--concurrency", str(concurrency)] if concurrency else []
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "evalq.cli", "run", str(job), "--out", str(out), "-q", *extra],
                          cwd=ROOT, env={**os.environ, "EVALQ_HISTORY": "off"})
    total = time.perf_counter() - t0
    assert done.returncode == 0
    return total, json.loads((out / "run.json").read_text())["wall_time"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    args = parser.parse_args()
    records = runs(args.n)
    with tempfile.TemporaryDirectory(prefix="evalq-bench-traj-") as tmp:
        data = Path(tmp) / "agents.jsonl"
        with open(data, "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
        job = Path(tmp) / "job.json"
        job.write_text(json.dumps({"dataset": {"uri": str(data)}, "metrics": METRICS}))
        dist, cluster = evalq_run(job, Path(tmp) / "out", None)
        lines = sum(1 for _ in open(Path(tmp) / "out" / "log.jsonl"))
        assert lines == 2 * args.n, lines
        one, one_cluster = evalq_run(job, Path(tmp) / "out1", 1)
        size = data.stat().st_size
        whole = in_process_whole(data, Path(tmp) / "local.jsonl")
        best = in_process_whole(data, Path(tmp) / "local.jsonl", parse_once=True)
    local = in_process(records)
    cores = os.cpu_count()
    print(f"machine: {cores} cores; N={args.n:,} agent runs x 10 tool calls ({size / 1e6:.0f} MB of chat "
          f"logs) x (trajectory, tool_call_f1)")
    print(f"in-process loop (1 process, metrics only): {local:8.2f} s ({2 * args.n / local:,.0f} items/s)")
    print(f"in-process loop (1 process, read+score+log): {whole:6.2f} s ({2 * args.n / whole:,.0f} items/s)")
    print(f"  the same, each run's calls parsed once : {best:8.2f} s ({2 * args.n / best:,.0f} items/s)")
    print(f"evalq run (embedded, everything)         : {dist:8.2f} s ({2 * args.n / dist:,.0f} items/s)")
    print(f"  of which read+validate+store (submitting): {dist - cluster:7.2f} s; cluster (score on {cores} worker "
          f"processes, write outputs): {cluster:.2f} s")
    print(f"evalq run, 1 worker process              : {one:8.2f} s; cluster {one_cluster:.2f} s "
          f"(the cluster part {one_cluster / cluster:.2f}x the {cores}-process one)")
    print(f"ratio distributed / in-process           : {dist / local:.2f} (metrics only), {dist / whole:.2f} "
          f"(read+score+log), {dist / best:.2f} (read+score+log, calls parsed once)")


if __name__ == "__main__":
    main()
