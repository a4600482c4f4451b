"""Distributed vs in-process on the same data, measured in the same run.

N synthetic instances x (bleu, rouge, f1_score): `evalq run` in embedded mode
(private Redis, local workers, outputs written) against a single-process loop
calling the same metric functions on the same instances. Prints both wall
times, their ratio (goal <= 0.8 on a 2-core machine) and the orchestrator's
peak RSS. `evalq run` goes twice per round: with the run recorded in the history store
(the default; a fresh SQLite store per round) and with EVALQ_HISTORY=off, so what
recording costs is measured in the same run (goal: within 10%).

    .venv/bin/python bench/bench_cpu.py [--n 100000] [--chunk-size 250] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

VOCAB = ("the a cat dog sat ran on under over mat sofa quickly slowly red blue green house garden "
         "river city people model answer question found said made went small large old new first "
         "last good bad time year day man woman child world life hand part place case week").split()

METRICS = [
    {"id": "bleu", "enable": True,
     "parameters": {"weights": [0.25, 0.25, 0.25, 0.25], "smoothing_function": "method1", "auto_reweigh": False}},
    {"id": "rouge", "enable": True, "parameters": {"rouge_types": ["rouge1", "rouge2", "rougeL"]}},
    {"id": "f1_score", "enable": True, "parameters": {}},
]


def synthetic(n: int, seed: int = 7) -> list[dict]:
    rng = random.Random(seed)

    def sentence() -> str:
        return " ".join(rng.choice(VOCAB) for _ in range(rng.randint(8, 25))) + "."

    return [{"id": str(i), "input": "Translate: " + sentence(), "actual-output": sentence(),
             "expected-output": [sentence() for _ in range(rng.randint(1, 3))]} for i in range(n)]


def in_process(instances: list[dict]) -> float:
    import evalq.shared.job.catalogue  # noqa: F401
    from evalq.shared.metrics.registry import REGISTRY

    runs = []
    for m in METRICS:
        spec = REGISTRY.get(m["id"])
        runs.append((spec.load(), spec.params.model_validate(m["parameters"])))
    t0 = time.perf_counter()
    for inst in instances:
        for fn, params in runs:
            fn(inst, params)
    return time.perf_counter() - t0


def distributed(job_path: Path, out: Path, chunk_size: int | None, history: Path | None) -> tuple[float, int]:
    """``history``: the folder of a fresh history store (EVALQ_CACHE_DIR), None: EVALQ_HISTORY=off."""
    cmd = [sys.executable, "-m", "evalq.cli", "run", str(job_path), "--out", str(out), "-q"]
    env = {**os.environ, **({"EVALQ_CACHE_DIR": str(history)} if history else {"EVALQ_HISTORY": "off"})}
    env.pop("EVALQ_HISTORY_URL", None)
    if history:
        env.pop("EVALQ_HISTORY", None)
    if chunk_size:
        cmd += ["--chunk-size", str(chunk_size)]
    peak = [0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
    ps = psutil.Process(proc.pid)

    def sample() -> None:
        while proc.poll() is None:
            try:
                peak[0] = max(peak[0], ps.memory_info().rss)
            except psutil.NoSuchProcess:
                return
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    rc = proc.wait()
    elapsed = time.perf_counter() - t0
    sampler.join()
    if rc != 0:
        raise SystemExit(f"evalq run failed with exit code {rc}")
    return elapsed, peak[0]


def report_pass(out: Path) -> float:
    """Seconds `evalq report` takes to rebuild report.html from the run's outputs (every
    log line parsed once): what the final callback no longer pays, since the workers keep
    each chunk's view of the report."""
    from evalq.results.report import report_from_outputs

    t0 = time.perf_counter()
    report_from_outputs(str(out))
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--chunk-size", type=int, default=None)
    parser.add_argument("--repeat", type=int, default=3,
                        help="alternating runs of each; medians are compared (a shared VM is noisy)")
    args = parser.parse_args()

    instances = synthetic(args.n)
    locals_, dists, offs, peaks, reports = [], [], [], [], []
    with tempfile.TemporaryDirectory(prefix="evalq-bench-") as tmp:
        job_path = Path(tmp) / "job.json"
        job_path.write_text(json.dumps({"instances": instances, "metrics": METRICS}))
        for i in range(args.repeat):
            out = Path(tmp) / f"out{i}"
            dist, peak_rss = distributed(job_path, out, args.chunk_size, Path(tmp) / f"history{i}")
            offs.append(distributed(job_path, Path(tmp) / f"off{i}", args.chunk_size, None)[0])
            lines = sum(1 for _ in open(out / "log.jsonl"))
            assert lines == 3 * args.n, f"log has {lines} lines, expected {3 * args.n}"
            dists.append(dist)
            peaks.append(peak_rss)
            reports.append(report_pass(out))
            locals_.append(in_process(instances))
    local, dist, off = statistics.median(locals_), statistics.median(dists), statistics.median(offs)

    print(f"machine: {os.cpu_count()} cores; N={args.n} instances x 3 metrics (bleu, rouge, f1_score); "
          f"medians of {args.repeat} alternating runs")
    print(f"in-process loop (1 process)      : {local:8.2f} s  ({3 * args.n / local:,.0f} items/s)  "
          f"runs: {', '.join(f'{t:.1f}' for t in locals_)}")
    print(f"evalq run, embedded (end to end) : {dist:8.2f} s  ({3 * args.n / dist:,.0f} items/s)  "
          f"runs: {', '.join(f'{t:.1f}' for t in dists)}")
    print(f"ratio distributed / in-process   : {dist / local:8.2f}  (goal <= 0.8)")
    print(f"evalq run, EVALQ_HISTORY=off     : {off:8.2f} s  runs: {', '.join(f'{t:.1f}' for t in offs)}")
    print(f"history on / off                 : {dist / off:8.2f}  (goal <= 1.10)")
    print(f"orchestrator peak RSS            : {max(peaks) / 2**20:8.1f} MiB")
    print(f"evalq report from the log (apart): {statistics.median(reports):7.2f} s  (parsing {3 * args.n:,} "
          "log lines once; the run itself draws report.html from its workers' chunk views)")


if __name__ == "__main__":
    main()
