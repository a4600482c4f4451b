"""How a night's size weighs on the broker's Redis (issue 59): instances kept in Redis (the old path)
against instances staged in the job store (``EVALQ_STORE``, Parquet parts in a local folder), in one run.

N RAG-style instances (a ~1 kB context each) x ``exact_match`` and ``f1_score`` through a loopback
cluster (a real redis-server, one jobs worker and one cpu worker, ``evalq run --broker``), for each N
given and each path. Prints per N and path: the run's wall time and items/s, Redis's peak used memory
during the job (sampled every 0.1 s) and after it ended, the bytes of Redis per byte of dataset, the
store's bytes at rest, and the jobs worker's peak RSS.
Issue 59's goal for the path that keeps instances and records in object storage: Redis's peak flat in
N and <= 96 MiB, <= 32 MiB after the job, no slower in items/s, the final callback's RSS flat in N.

    .venv/bin/python bench/bench_scale.py [--n 20000 100000 400000] [--paths redis store]
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
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
import redis  # noqa: E402

from evalq.cli.embedded import EmbeddedRedis, LocalWorker  # noqa: E402

WORDS = ("the river crosses a valley where farmers grow wheat barley and grapes under a dry summer sun while "
         "the town keeps its old stone bridge market square and a museum of local history").split()


def dataset(path: Path, n: int) -> int:
    """N instances with a ~1 kB context; returns the file's size in bytes."""
    with open(path, "w") as f:
        for i in range(n):
            context = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(170))[:1000]
            f.write(json.dumps({"id": f"q{i}", "question": f"What does the text say about item {i}?",
                                "context": [context], "answer": f"the bridge {i % 7}",
                                "ground_truth": f"the bridge {i % 5}"}) + "\n")
    return path.stat().st_size


def largest_rss(proc: psutil.Process) -> int:
    """The largest RSS among a worker's processes (the pool process that runs the final callback)."""
    largest = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            largest = max(largest, p.memory_info().rss)
        except psutil.NoSuchProcess:
            pass
    return largest


def wait_for(url: str, names: list[str]) -> None:
    from evalq.orchestrator.app import client_app

    app, deadline = client_app(url), time.monotonic() + 60
    while time.monotonic() < deadline:
        replies = app.control.ping(timeout=0.5) or []
        if all(any(node.startswith(name) for reply in replies for node in reply) for name in names):
            return
    raise SystemExit(f"workers {names} did not answer within 60 s")


def one(n: int, workdir: Path, path: str) -> dict:
    server = EmbeddedRedis(workdir / f"redis{n}{path}")
    (workdir / f"redis{n}{path}").mkdir()
    server.start()
    r = redis.Redis.from_url(server.url)
    names = [f"jobs{uuid.uuid4().hex[:4]}", f"cpu{uuid.uuid4().hex[:4]}"]
    # a history store of the run's own (EVALQ_CACHE_DIR): no earlier run of the same job to pair with,
    # whose items the final callback would load, so each path's RSS is its own
    worker_env = {"EVALQ_BACKLOG_PORT": "0", "EVALQ_CACHE_DIR": str(workdir / f"cache{n}{path}")}
    jobs, cpu = (LocalWorker(server.url, [queue], workdir, 2, name=name, env=worker_env)
                 for queue, name in zip(("evalq.jobs", "cpu"), names))
    try:
        jobs.start()
        cpu.start()
        data = workdir / f"data{n}.jsonl"
        size = data.stat().st_size if data.exists() else dataset(data, n)
        store = workdir / f"store{n}"
        env = {"EVALQ_STORE": str(store)} if path == "store" else {}
        job = workdir / f"job{n}.json"
        job.write_text(json.dumps({"dataset": {"uri": str(data)},
                                   "metrics": [{"id": "exact_match"}, {"id": "f1_score"}]}))
        wait_for(server.url, names)  # the workers' start, outside the timing
        base = r.info("memory")["used_memory"]
        peak, rss, done = [base], [0], threading.Event()

        def watch() -> None:
            parent = psutil.Process(jobs.proc.pid)
            while not done.is_set():
                peak[0] = max(peak[0], r.info("memory")["used_memory"])
                rss[0] = max(rss[0], largest_rss(parent))
                time.sleep(0.1)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "evalq.cli", "run", str(job), "--broker", server.url,
                               "--out", str(workdir / f"out{n}{path}"), "-q"], cwd=ROOT, capture_output=True, text=True,
                              env={**os.environ, **env})
        wall = time.perf_counter() - t0
        done.set()
        watcher.join()
        if proc.returncode != 0:
            raise SystemExit(f"N={n}: evalq run failed: {proc.stderr[-2000:]}")
        after = r.info("memory")["used_memory"]
        at_rest = sum(f.stat().st_size for f in store.rglob("*.parquet")) if path == "store" else 0
        return {"n": n, "path": path, "dataset_mib": size / 2**20, "wall_s": wall, "items_per_s": 2 * n / wall,
                "redis_peak_mib": (peak[0] - base) / 2**20, "redis_after_mib": (after - base) / 2**20,
                "redis_per_dataset_byte": (peak[0] - base) / size,
                "store_mib": at_rest / 2**20, "jobs_worker_rss_mib": rss[0] / 2**20}
    finally:
        jobs.stop()
        cpu.stop()
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, nargs="+", default=[20_000, 100_000, 400_000])
    parser.add_argument("--paths", nargs="+", choices=["redis", "store"], default=["redis", "store"])
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="evalq-bench-scale-") as tmp:
        for n in args.n:
            for path in args.paths:
                rows.append(one(n, Path(tmp), path))
            print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in rows[-1].items()}),
                  flush=True)
    print(f"\n{'N':>9} {'path':>6} {'dataset MiB':>12} {'s':>7} {'items/s':>9} {'Redis peak MiB':>15} "
          f"{'after MiB':>10} {'B/B':>5} {'store MiB':>10} {'jobs RSS MiB':>13}")
    for row in rows:
        print(f"{row['n']:>9} {row['path']:>6} {row['dataset_mib']:>12.1f} {row['wall_s']:>7.1f} {row['items_per_s']:>9.0f} "
              f"{row['redis_peak_mib']:>15.1f} {row['redis_after_mib']:>10.1f} {row['redis_per_dataset_byte']:>5.2f} "
              f"{row['store_mib']:>10.1f} {row['jobs_worker_rss_mib']:>13.0f}")


if __name__ == "__main__":
    main()
