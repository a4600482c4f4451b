"""bertscore three ways on the same pairs, model, layer, batch size and device, in one run:

- BERTScorer in-process: ``bert_score.BERTScorer(...).score(cands, refs)`` on all pairs at once
  (model loaded and warmed up beforehand, not timed);
- evalq's engine in-process: the bertscore metric function (``evalq.workers.metrics.bertscore.metric``,
  ``engine: evalq``) called on all instances in this process, warmed up likewise;
- the gpu queue: ``evalq.cli.run.run_job`` against an embedded cluster (private Redis plus one
  gpu-queue worker, as ``evalq run`` starts it), the worker warmed up with a small job first; the
  timed run covers submission, the idf prepare step, storing the instances, every chunk,
  aggregation and writing the outputs;
- and, with ``--cold``, a cold ``evalq run`` of the same job as a fresh command (its Redis, its
  worker's start and model load included), in ``--cold-rounds`` rounds, each against BERTScorer warm
  timed again just before it (this VM's speed drifts by 10 to 20% within minutes).

F1 is compared item by item with BERTScorer's. Runs alternate and the median of each is reported.
The gpu worker's process tree RSS is sampled every 50 ms for its whole life and the peak printed.

    .venv/bin/python bench/bench_bertscore.py                  # 2000 pairs, CPU when no GPU
    .venv/bin/python bench/bench_bertscore.py --n 4000 --cold --cold-rounds 3  # the CPU goal: cold evalq run vs BERTScorer warm
    .venv/bin/python bench/bench_bertscore.py --n 500 --repeats 1 --first-job 10  # EVALQ_PRELOAD: a worker's first job
    .venv/bin/python bench/bench_bertscore.py --device cuda --n 20000 --batch-size 256 --params '{"dtype": "bf16"}'
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORDS = ("time person year way day thing man world life hand part child eye woman place work week case "
         "point government company number group problem fact be have do say get make go know take see "
         "come think look want give use find tell ask seem feel try leave call good new first last long "
         "great little own other old right big high different small large next early young important "
         "few public bad same able river city music garden window morning letter market doctor answer "
         "quickly slowly often never always together again almost already later soon today").split()


def synthetic(n: int, refs_per_item: int, seed: int) -> list[dict]:
    """Candidates of 8-30 words; references are edits of them (some words
    replaced, dropped or added), so scores spread over a realistic range."""
    rng = random.Random(seed)

    def perturb(words: list[str]) -> str:
        out = []
        for w in words:
            r = rng.random()
            if r < 0.15:
                out.append(rng.choice(WORDS))
            elif r < 0.22:
                continue
            else:
                out.append(w)
            if rng.random() < 0.05:
                out.append(rng.choice(WORDS))
        return " ".join(out).capitalize() + "."

    instances = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(8, 30))]
        instances.append({"id": f"p{i}", "input": "synthetic",
                          "actual-output": " ".join(words).capitalize() + ".",
                          "expected-output": [perturb(words) for _ in range(refs_per_item)]})
    return instances


class TreeRss:
    """Peak RSS of a process and its descendants, sampled in a thread."""

    def __init__(self, pid: int, interval: float = 0.05):
        import psutil

        self.proc = psutil.Process(pid)
        self.interval = interval
        self.peak = 0
        self.last = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            total = 0
            try:
                for p in [self.proc, *self.proc.children(recursive=True)]:
                    try:
                        total += p.memory_info().rss
                    except psutil.Error:
                        pass
            except psutil.Error:
                break
            self.last = total
            self.peak = max(self.peak, total)
            self._stop.wait(self.interval)

    def __enter__(self) -> "TreeRss":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def gpu_memory_mib(pid: int) -> int | None:
    """GPU memory nvidia-smi attributes to a process, if there is nvidia-smi."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid):
            return int(parts[1])
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000, help="pairs (instances)")
    ap.add_argument("--refs", type=int, default=1, help="references per instance")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--device", default=None, help="cpu, cuda, cuda:N [default: cuda if present, else cpu]")
    ap.add_argument("--chunk-size", type=int, default=None, help="items per task [default: the registry's]")
    ap.add_argument("--model-type", default=None, help="[default: the bundled all-MiniLM-L6-v2]")
    ap.add_argument("--num-layers", type=int, default=None)
    ap.add_argument("--idf", action="store_true")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs each way (median reported)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ap.add_argument("--params", default="{}", help="JSON object of extra bertscore parameters (evalq's side): "
                    '{"dtype": "bf16"}, {"engine": "bert_score"}, {"max_batch_tokens": 4096}')
    ap.add_argument("--cold", action="store_true", help="also time a cold `evalq run` of the job (a new command)")
    ap.add_argument("--cold-rounds", type=int, default=1, metavar="K",
                    help="with --cold: K rounds, each BERTScorer warm timed again just before the cold run, "
                         "so that a VM that slows down or speeds up meanwhile weighs on both [default: 1]")
    ap.add_argument("--gpu-processes", type=int, nargs="+", default=None, metavar="N",
                    help="the gpu worker's processes (the queue's cluster: the first N; with --cold, each round "
                         "runs a cold `evalq run` with each N in turn) [default: evalq run's]")
    ap.add_argument("--first-job", type=float, default=None, metavar="IDLE_S",
                    help="also time a first small job on a fresh cluster whose worker was started IDLE_S seconds "
                         "before, without and with EVALQ_PRELOAD")
    args = ap.parse_args()

    import torch
    from bert_score import BERTScorer

    import evalq.cli.run as runner
    from evalq.cli.embedded import EmbeddedCluster
    from evalq.cli.workerargs import local_gpu_processes
    from evalq.shared.job.schema import parse_job
    from evalq.shared.metrics.registry import REGISTRY
    from evalq.shared.metrics import bertscore as bs

    processes = args.gpu_processes or [local_gpu_processes()]

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    params = {"batch_size": args.batch_size, "device": device, "idf": args.idf}
    if args.model_type:
        params["model_type"] = args.model_type
    if args.num_layers is not None:
        params["num_layers"] = args.num_layers
    params.update(json.loads(args.params))
    instances = synthetic(args.n, args.refs, args.seed)
    metrics = [{"id": "bertscore", "parameters": params}]
    job = parse_job({"instances": instances, "metrics": metrics}, source="bench")
    warm_job = parse_job({"instances": synthetic(2 * args.batch_size, args.refs, args.seed + 1),
                          "metrics": metrics}, source="bench-warmup")
    resolved = bs.resolve(job.metrics[0].params)
    from evalq.shared.metrics.registry import device_chunk

    chunk = args.chunk_size or device_chunk(args.n, *REGISTRY.get("bertscore").device_chunk)
    cands = [i["actual-output"] for i in instances]
    refs = [i["expected-output"] for i in instances]

    print(f"bertscore benchmark: {args.n} pairs x {args.refs} reference(s), model {resolved.name} "
          f"(layer {resolved.num_layers}), batch_size {args.batch_size}, chunk_size {chunk}, "
          f"idf {args.idf}, device {device}, gpu worker processes {processes}")
    gpu = torch.cuda.get_device_name(0) if device.startswith("cuda") else None
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}"
          + (f", GPU {gpu}" if gpu else ""))

    scorer = BERTScorer(model_type=resolved.path, num_layers=resolved.num_layers, device=device,
                        idf=args.idf, idf_sents=[r for g in refs for r in g] if args.idf else None,
                        batch_size=args.batch_size)
    scorer.score(cands[:2 * args.batch_size], refs[:2 * args.batch_size], batch_size=args.batch_size)
    from evalq.workers.metrics.bertscore.metric import bertscore as engine_metric

    engine_params = job.metrics[0].params
    prepared = REGISTRY.get("bertscore").load_prepare()(instances, engine_params)
    engine_metric(instances[:2 * args.batch_size], engine_params, prepared)  # warm: model loaded, kernels ready

    # In cluster mode run_job asks the workers which queues they consume and
    # waits a fixed 1 s for replies; this cluster is ours, so skip the advisory check.
    runner._warn_missing_workers = lambda *a, **k: None

    inproc, engine, pipe, worker_scoring = [], [], [], []
    summary = None
    with tempfile.TemporaryDirectory(prefix="bench-bertscore-") as tmp, EmbeddedCluster(job.queues, gpu_processes=processes[0]) as cluster:
        worker = cluster.workers[0]
        with TreeRss(worker.proc.pid) as rss:
            t0 = time.perf_counter()
            runner.run_job(warm_job, Path(tmp) / "warm", broker=cluster.broker_url, chunk_size=chunk,
                           progress=False)
            cold = time.perf_counter() - t0
            rss_loaded = rss.last
            for i in range(args.repeats):
                t0 = time.perf_counter()
                P, R, F = scorer.score(cands, refs, batch_size=args.batch_size)
                inproc.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                in_engine = engine_metric(instances, engine_params, prepared)
                engine.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                summary = runner.run_job(job, Path(tmp) / f"run{i}", broker=cluster.broker_url,
                                         chunk_size=chunk, progress=False)
                pipe.append(time.perf_counter() - t0)
                worker_scoring.append(summary[0]["elapsed_time"])
            gpu_mib = gpu_memory_mib(worker.proc.pid) if gpu else None
        log = [json.loads(line) for line in (Path(tmp) / f"run{args.repeats - 1}" / "log.jsonl")
               .read_text().splitlines()]
    diff = max(abs(line["result"]["f1"] - f) for line, f in zip(log, F.tolist()))
    engine_diff = max(abs(r["f1"] - f) for r, f in zip(in_engine, F.tolist()))
    cold_run, cold_rounds = None, []
    if args.cold:  # a fresh `evalq run`: its Redis, its worker's start and model load, then the job
        with tempfile.TemporaryDirectory(prefix="bench-bertscore-cold-") as tmp:
            path = Path(tmp) / "job.json"
            path.write_text(json.dumps({"instances": instances, "metrics": metrics}))
            for k in range(max(1, args.cold_rounds)):
                t0 = time.perf_counter()  # BERTScorer warm again, right before: the pair shares the VM's mood
                scorer.score(cands, refs, batch_size=args.batch_size)
                warm = time.perf_counter() - t0
                row = {"bertscorer_warm_s": round(warm, 2)}
                for n in processes:
                    t0 = time.perf_counter()
                    done = subprocess.run([sys.executable, "-m", "evalq.cli", "run", str(path), "--out",
                                           str(Path(tmp) / f"out{k}-{n}"), "-q", "--gpu-processes", str(n)]
                                          + (["--chunk-size", str(chunk)] if args.chunk_size else []),
                                          cwd=ROOT, capture_output=True, text=True)
                    row[f"cold_evalq_run_{n}p_s"] = round(time.perf_counter() - t0, 2)
                    if done.returncode != 0:
                        raise SystemExit(f"cold evalq run failed: {done.stderr[-2000:]}")
                cold_rounds.append(row)
        key = f"cold_evalq_run_{processes[0]}p_s"  # the headline: the first N
        cold_run = statistics.median(r[key] for r in cold_rounds)
        others = {n: statistics.median(r[f"cold_evalq_run_{n}p_s"] / r["bertscorer_warm_s"] for r in cold_rounds)
                  for n in processes}
        cold_ratio = others[processes[0]]

    first_job = {}
    if args.first_job is not None:  # a worker that started a while ago gets its first job
        from evalq.shared.job.preload import ENV as PRELOAD_ENV, setting

        for preload in (False, True):
            env = {PRELOAD_ENV: setting(warm_job.metrics)} if preload else {}
            with tempfile.TemporaryDirectory(prefix="bench-bertscore-first-") as tmp, \
                    EmbeddedCluster(job.queues, env=env) as cluster:
                time.sleep(args.first_job)
                t0 = time.perf_counter()
                runner.run_job(warm_job, Path(tmp) / "first", broker=cluster.broker_url, progress=False)
                first_job["preload" if preload else "lazy"] = round(time.perf_counter() - t0, 2)

    t_in, t_engine, t_pipe, t_work = (statistics.median(x) for x in (inproc, engine, pipe, worker_scoring))
    figures = {
        "pairs": args.n, "refs_per_pair": args.refs, "batch_size": args.batch_size, "chunk_size": chunk,
        "device": device, "gpu": gpu, "model": resolved.name, "num_layers": resolved.num_layers,
        "idf": args.idf, "repeats": args.repeats,
        "params": params, "engine_inprocess_s": round(t_engine, 3),
        "engine_speedup_vs_bertscorer": round(t_in / t_engine, 2), "engine_max_abs_f1_difference": engine_diff,
        "cold_evalq_run_s": round(cold_run, 2) if cold_run is not None else None,
        "cold_run_vs_bertscorer_warm": round(cold_ratio, 3) if cold_run is not None else None,
        "cold_rounds": cold_rounds or None, "gpu_processes": processes,
        "cold_run_vs_bertscorer_warm_by_processes": ({str(n): round(v, 3) for n, v in others.items()}
                                                     if args.cold else None),
        "inprocess_s": round(t_in, 3), "pipeline_s": round(t_pipe, 3), "worker_scoring_s": round(t_work, 3),
        "inprocess_pairs_per_s": round(args.n / t_in, 1), "pipeline_pairs_per_s": round(args.n / t_pipe, 1),
        "ratio": round(t_in / t_pipe, 3),
        "worker_cold_start_s": round(cold, 2),
        "worker_peak_rss_mib": round(rss.peak / 2**20, 1),
        "worker_rss_after_model_load_mib": round(rss_loaded / 2**20, 1),
        "worker_gpu_memory_mib": gpu_mib,
        "max_abs_f1_difference": diff,
        "first_job_s": first_job or None,
    }
    print(f"in-process BERTScorer : {figures['inprocess_pairs_per_s']:>9} pairs/s  "
          f"(median {t_in:.2f} s of {args.repeats})")
    print(f"evalq engine in-process: {args.n / t_engine:>8.1f} pairs/s  (median {t_engine:.2f} s; "
          f"{t_in / t_engine:.2f}x BERTScorer; max |dF1| {engine_diff:.1e})")
    print(f"evalq gpu queue       : {figures['pipeline_pairs_per_s']:>9} pairs/s  "
          f"(median {t_pipe:.2f} s end to end; {t_work:.2f} s of it scoring in the worker)")
    print(f"ratio (BERTScorer in-process time / queue time): {figures['ratio']:.3f}")
    if cold_run is not None:
        for k, r in enumerate(cold_rounds, 1):
            print(f"cold round {k}: BERTScorer warm {r['bertscorer_warm_s']:.2f} s, then a cold `evalq run` "
                  + ", ".join(f"with {n} gpu process(es) {r[f'cold_evalq_run_{n}p_s']:.2f} s = "
                              f"{r[f'cold_evalq_run_{n}p_s'] / r['bertscorer_warm_s']:.3f} x" for n in processes))
        for n, ratio in others.items():
            print(f"cold `evalq run --gpu-processes {n}` (new command, worker start and model load included): "
                  f"median {ratio:.3f} x BERTScorer warm timed just before it, median of {len(cold_rounds)} "
                  f"round(s) (goal <= 1)")
    print(f"gpu worker: peak RSS {figures['worker_peak_rss_mib']} MiB (process tree, sampled every 50 ms); "
          f"{figures['worker_rss_after_model_load_mib']} MiB after loading the model; "
          f"first job incl. model load {cold:.1f} s"
          + (f"; GPU memory {gpu_mib} MiB" if gpu_mib is not None else ""))
    print(f"max |F1 queue - F1 BERTScorer| = {diff:.2e}")
    if first_job:
        print(f"first job ({len(warm_job.instances)} pairs) on a worker started {args.first_job:.0f} s before: "
              f"{first_job['lazy']:.2f} s loading the model when the chunk came, "
              f"{first_job['preload']:.2f} s with EVALQ_PRELOAD")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
