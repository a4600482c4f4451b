"""A gpu worker of several processes on a CPU: the CPUs of its idle processes lent to those
scoring (``evalq.workers.cores``), against each process kept to its own share, in the same run.

Each round runs a cold ``evalq run --gpu-processes N`` of the same job twice, alternating which
goes first: as evalq runs it (lending), and with ``OMP_NUM_THREADS`` set to the share evalq would
give each process, which turns lending off (an operator's setting is kept) and is how the worker ran
before. The default jobs: bertscore on 1,500 pairs (three chunks of 512 for two processes: one
process scores the third alone) and toxicity on 20,000 texts in three chunks. Their log.jsonl
values are compared.

    .venv/bin/python bench/bench_gpu_lending.py --rounds 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def jobs(pairs: int, texts: int) -> dict[str, tuple[dict, int]]:
    """name -> (job, chunk size giving three chunks)."""
    from bench_bertscore import synthetic

    words = "you are a lovely stupid kind idiot friend person awful great river city music garden".split()
    tox = [{"id": f"t{i}", "actual-output": " ".join(words[(i * k) % len(words)] for k in range(1, 8 + i % 30))}
           for i in range(texts)]
    return {
        "bertscore": ({"instances": synthetic(pairs, 1, 0),
                       "metrics": [{"id": "bertscore", "parameters": {"device": "cpu"}}]}, -(-pairs // 3)),
        "toxicity": ({"instances": tox, "metrics": [{"id": "toxicity", "parameters": {"device": "cpu"}}]},
                     -(-texts // 3)),
    }


def run(path: Path, out: Path, processes: int, chunk: int, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "evalq.cli", "run", str(path), "--out", str(out), "-q",
                           "--gpu-processes", str(processes), "--chunk-size", str(chunk)],
                          cwd=ROOT, capture_output=True, text=True, env={**os.environ, **env})
    if done.returncode != 0:
        raise SystemExit(f"evalq run failed: {done.stderr[-2000:]}")
    return time.perf_counter() - t0


def values(out: Path) -> dict[str, dict]:
    return {line["instance_id"]: line["result"] for line in map(json.loads, (out / "log.jsonl").read_text().splitlines())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--gpu-processes", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=1500)
    ap.add_argument("--texts", type=int, default=20000)
    ap.add_argument("--only", choices=("bertscore", "toxicity"), default=None)
    args = ap.parse_args()
    os.environ.pop("OMP_NUM_THREADS", None)  # evalq's own split, else lending is off in both
    from evalq.cli.workerargs import cpu_count

    share = max(1, cpu_count() // args.gpu_processes)
    print(f"gpu worker of {args.gpu_processes} processes on {cpu_count()} CPUs (own share {share} thread(s) each); "
          f"cold `evalq run` of each job, {args.rounds} alternating rounds")
    ways = {"lent": {}, "own share": {"OMP_NUM_THREADS": str(share)}}
    with tempfile.TemporaryDirectory(prefix="bench-lending-") as tmp:
        for name, (job, chunk) in jobs(args.pairs, args.texts).items():
            if args.only and name != args.only:
                continue
            path = Path(tmp) / f"{name}.json"
            path.write_text(json.dumps(job))
            times: dict[str, list[float]] = {way: [] for way in ways}
            for k in range(args.rounds):
                for way in (list(ways) if k % 2 == 0 else list(ways)[::-1]):
                    times[way].append(run(path, Path(tmp) / f"{name}-{way}", args.gpu_processes, chunk, ways[way]))
            a, b = values(Path(tmp) / f"{name}-lent"), values(Path(tmp) / f"{name}-own share")
            diff = max(abs(a[i][k] - b[i][k]) for i in a for k in a[i] if isinstance(a[i][k], float))
            lent, own = statistics.median(times["lent"]), statistics.median(times["own share"])
            print(f"{name}: {len(job['instances'])} items in chunks of {chunk}: lent {lent:.2f} s, own share "
                  f"{own:.2f} s (medians; rounds: lent {', '.join(f'{t:.2f}' for t in times['lent'])}; own "
                  f"share {', '.join(f'{t:.2f}' for t in times['own share'])}): {own / lent:.2f}x faster lent; "
                  f"max |value difference| {diff:.1e}")


if __name__ == "__main__":
    main()
