"""A fast metric through evalq against the same metric in one process, measured in the same run.

Issue 40's "fast metrics at the pace of the metric": for a metric that takes microseconds an item
(exact_match here), what evalq adds per item (storing the instance, the chunk's read and decode,
the item's record, the chunk's aggregate part and report view, the final callback's outputs) is
most of a job's time. Per round, on the same N synthetic instances:

- the metric function called in one process (the metric's own time);
- ``run_job`` on an embedded cluster whose workers are already warm (private Redis, a prefork cpu
  worker, outputs written: log.jsonl, results.json, report.html), with one worker process, so that
  its wall time minus the metric's is what the job path costs per item, and with one process per
  core, the cluster's speed against the one-process loop.

The submission (parse excluded: the job is parsed before timing; storing the instances and
sending the chunks) and the cluster's part (scoring and the final callback) are timed apart.

    .venv/bin/python bench/bench_fast_metrics.py [--n 100000] [--metric exact_match] [--repeat 3]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_cpu import synthetic  # noqa: E402


def in_process(metric: str, instances: list[dict]) -> float:
    import evalq.shared.job.catalogue  # noqa: F401
    from evalq.shared.metrics.registry import REGISTRY

    spec = REGISTRY.get(metric)
    fn, params = spec.load(), spec.params()
    t0, c0 = time.perf_counter(), time.process_time()
    for inst in instances:
        fn(inst, params)
    return time.perf_counter() - t0, time.process_time() - c0


def cluster_cpu(cluster) -> float:
    """CPU seconds (user + system) used so far by the cluster's processes: its Redis and its
    workers with their pool children. Unlike wall time, not inflated by a noisy neighbour."""
    import psutil

    total = 0.0
    for proc in [cluster.redis.proc] + [w.proc for w in cluster.workers]:
        try:
            top = psutil.Process(proc.pid)
            for p in [top] + top.children(recursive=True):
                t = p.cpu_times()
                total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def through_evalq(cluster, job, out: Path) -> tuple[float, float, float]:
    """(submission, cluster) seconds of one job on a warm cluster, and the CPU seconds it cost
    (the submitting process's and the cluster's)."""
    from evalq.cli import wait as waiting
    from evalq.cli.run import finished
    from evalq.orchestrator import submit

    r = waiting.connect(cluster.broker_url)
    cpu0, own0 = cluster_cpu(cluster), time.process_time()
    t0 = time.perf_counter()
    job_id = submit.submit(r, cluster.broker_url, job, out=str(out))
    t1 = time.perf_counter()
    status = waiting.wait(r, cluster.broker_url, job_id, on_progress=lambda _: None, check=cluster.check,
                          stall_timeout=300)
    t2 = time.perf_counter()
    cpu = cluster_cpu(cluster) - cpu0 + time.process_time() - own0
    summary = finished(r, job_id, status)
    assert summary[0]["n"] == len(job.instances) and not summary[0].get("n_errors"), summary
    submit.delete_job(r, job_id, [m.key for m in job.runs])
    return t1 - t0, t2 - t1, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--metric", default="exact_match")
    parser.add_argument("--repeat", type=int, default=3,
                        help="rounds; medians and best runs are printed (this VM's speed drifts)")
    args = parser.parse_args()
    os.environ.setdefault("EVALQ_HISTORY", "off")  # the history store has its own bench (bench_history.py)

    from evalq.cli.embedded import EmbeddedCluster
    from evalq.shared.job.schema import parse_job

    instances = synthetic(args.n)
    job = parse_job({"instances": instances, "metrics": [{"id": args.metric}]}, source="bench")
    warm = parse_job({"instances": instances[:2000], "metrics": [{"id": args.metric}]}, source="warm")
    cores = os.cpu_count() or 1
    local: list[tuple[float, float]] = []
    runs: dict[int, list[tuple[float, float, float]]] = {1: [], cores: []}
    with tempfile.TemporaryDirectory(prefix="evalq-bench-") as tmp, contextlib.ExitStack() as stack:
        clusters = {c: stack.enter_context(EmbeddedCluster(job.queues, concurrency=c)) for c in runs}
        for c, cluster in clusters.items():
            through_evalq(cluster, warm, Path(tmp) / f"warm{c}")  # workers started, metric imported
        for i in range(args.repeat):
            local.append(in_process(args.metric, instances))
            for c, cluster in clusters.items():
                runs[c].append(through_evalq(cluster, job, Path(tmp) / f"out{c}-{i}"))

    from evalq.orchestrator.submit import chunks_of, outline

    n = args.n
    tasks = list(chunks_of(outline(job)))  # as the cluster plans them
    print(f"machine: {cores} cores; N={n:,} instances x {args.metric}; {args.repeat} rounds, median and best; "
          f"history off; {len(tasks)} tasks of up to {max(c.stop - c.start for c in tasks):,} items")
    walls_local = [w for w, _ in local]
    metric, best_metric = statistics.median(walls_local), min(walls_local)
    metric_cpu = statistics.median(c for _, c in local)
    print(f"metric in one process       : {metric:7.2f} s, best {best_metric:.2f} s ({n / best_metric:,.0f} items/s); "
          f"CPU {metric_cpu / n * 1e6:.1f} us/item; runs: {', '.join(f'{t:.2f}' for t in walls_local)}")
    for c, timed in runs.items():
        walls = [s + w for s, w, _ in timed]
        wall, best = statistics.median(walls), min(walls)
        sub, clu, _ = timed[walls.index(best)]
        cpu = statistics.median(u for _, _, u in timed)
        print(f"evalq, {c} worker process{'es' if c > 1 else '  '}: {wall:7.2f} s, best {best:.2f} s "
              f"({n / best:,.0f} items/s; submission {sub:.2f} s, cluster {clu:.2f} s); CPU {cpu / n * 1e6:.1f} us/item, "
              f"{(cpu - metric_cpu) / n * 1e6:.1f} beyond the metric's; runs: {', '.join(f'{t:.2f}' for t in walls)}")
        print(f"  speed against the one-process loop (medians): {metric / wall:.2f}; best runs: {best_metric / best:.2f}")

if __name__ == "__main__":
    main()
