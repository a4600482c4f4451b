"""The judge path at a self-hosted judge's pace (issue 73): what a judge call costs evalq, measured
against a plain loop of the openai SDK sending the same requests to the same server, in the same run.

judge-sim runs as a process of its own with many parallel slots (a vLLM-like server): ``--latency``
seconds a call (default 0.05), and once more with none. For each, ``coherence`` (a JSON-schema
rating) is asked of N items:

- the SDK loop: the same chat request (evalq's own prompt and body), ``client.chat.completions.create``
  from ``--threads`` threads of one process, the reply's JSON parsed; its CPU (user + system);
- evalq: a cluster on a private redis-server (one jobs worker, one or two judge workers), the job
  submitted by this process; the CPU of every evalq process (this client, the workers), not of
  judge-sim's nor Redis's (Redis's is its own line).

CPU per call is marginal: (CPU at N - CPU at N0) / (N - N0), so start-up and the final callback's
fixed share drop out. Calls per second is N / wall. Then, at N items each:

- Redis commands per judged item: every command a client sent (MONITOR; a script counts once), and
  beside it what ran inside scripts;
- parts and store requests: a local store (parts written, per 100,000 items) and an S3 store on
  moto (PUT/GET of record parts, and GETs per part in the final callback).

    .venv/bin/python bench/bench_judge_path.py [--n 2000] [--n0 400] [--latency 0.05] [--workers 1,2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from evalq.cli.embedded import EmbeddedRedis, LocalWorker, free_port  # noqa: E402

os.environ.setdefault("EVALQ_ENDPOINTS", "*=http://127.0.0.1:*")
os.environ.setdefault("EVALQ_S3_ENDPOINTS", "http://127.0.0.1:*")
os.environ.setdefault("EVALQ_S3_PREFIXES", "s3://*")
KEY_ENV = "BENCH_PATH_API_KEY"
AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
REGION = "path"


def instances(n: int) -> list[dict]:
    return [{"id": f"q{i}", "input": f"Question {i} about the quarterly report?",
             "actual-output": f"Answer {i}: revenue grew in the third quarter, as the report says, and costs "
                              f"fell. [[sim:score={1 + (i * 7) % 5}]]"} for i in range(n)]


def judge(base_url: str) -> dict:
    return {"provider": "openai", "model": "judge-sim", "api_key_env": KEY_ENV, "output": "json_schema",
            "max_tokens": 100, "deployments": [{"region": REGION, "base_url": base_url, "tpm": 200_000_000,
                                                "rpm": 1_000_000}]}


def job_doc(base_url: str, n: int) -> dict:
    return {"instances": instances(n), "judges": {"sim": judge(base_url)}, "judging": {"cache": False},
            "metrics": [{"id": "coherence", "parameters": {"judge": "sim"}}]}


# -- the SDK loop (a process of its own) ----------------------------------------------------------

def sdk_loop(base_url: str, n: int, threads: int) -> dict:
    """What a user writes in an afternoon: the same requests from a few threads of the openai SDK."""
    import openai

    from evalq.shared.judging.judges import JudgeConfig
    from evalq.workers.judge.requests import chat_request
    from evalq.workers.metrics.quality import prompt, rating_schema, scale

    config = JudgeConfig.model_validate(judge(base_url))
    client = openai.OpenAI(base_url=base_url, api_key="bench", max_retries=0, timeout=60)
    items, lock, scores = instances(n), threading.Lock(), []
    task = ("Rate COHERENCE: do the sentences of the ANSWER fit together and read naturally as a whole?\n"
            + scale("coherence"))

    def work(part: list[dict]) -> None:
        for inst in part:
            request = chat_request(config, prompt(task, [("QUESTION", inst["input"]),
                                                         ("ANSWER", inst["actual-output"])]), rating_schema(1, 5))
            reply = client.chat.completions.create(**request)
            score = json.loads(reply.choices[0].message.content)["score"]
            with lock:
                scores.append(score)

    before, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    pool = [threading.Thread(target=work, args=(items[i::threads],)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {"n": len(scores), "wall": time.perf_counter() - t0,
            "cpu": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime}


def run_sdk(base_url: str, n: int, threads: int) -> dict:
    """The SDK loop's CPU includes its imports: a run of N and of N0 cancel them out."""
    out = subprocess.run([sys.executable, __file__, "--sdk-loop", base_url, str(n), str(threads)],
                         capture_output=True, text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- evalq ------------------------------------------------------------------------------------------

def cpu_of(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            for p in [proc, *proc.children(recursive=True)]:
                t = p.cpu_times()
                total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


class Cluster:
    def __init__(self, workdir: Path, judges: int, env: dict[str, str]):
        workdir.mkdir(parents=True, exist_ok=True)
        self.redis = EmbeddedRedis(workdir)
        self.redis.start()
        self.workers = [LocalWorker(self.redis.url, [f"judge.{REGION}", "evalq.jobs"] if i == 0 else [f"judge.{REGION}"],
                                    workdir, None, name=f"judge{i}", env=env) for i in range(judges)]
        for w in self.workers:
            w.start()

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self.workers]

    def redis_cpu(self) -> float:
        return cpu_of([self.redis.proc.pid])

    def close(self) -> None:
        for w in self.workers:
            w.stop()
        self.redis.stop()


def self_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def run_evalq(cluster: Cluster, base_url: str, n: int, out: Path, chunk_size: int | None = None) -> dict:
    from evalq.cli.run import run_job
    from evalq.shared.job.schema import parse_job

    job = parse_job(job_doc(base_url, n))
    cpu0, redis0, t0 = cpu_of(cluster.pids()) + self_cpu(), cluster.redis_cpu(), time.perf_counter()
    summary = run_job(job, out, broker=cluster.redis.url, progress=False, stall_timeout=900, chunk_size=chunk_size)
    wall = time.perf_counter() - t0
    # the workers' CPU is read once they are idle again (the final callback has run)
    return {"n": summary[0]["n"], "errors": summary[0]["n_errors"], "wall": wall,
            "cpu": cpu_of(cluster.pids()) + self_cpu() - cpu0, "redis": cluster.redis_cpu() - redis0}


def count_commands(cluster: Cluster, base_url: str, n: int, out: Path) -> tuple[int, int, dict]:
    """(commands clients sent, commands run inside scripts, the first by name) while N items are judged."""
    import redis

    sent: dict[str, int] = {}
    inside = [0]
    stop = threading.Event()
    conn = redis.Redis.from_url(cluster.redis.url)
    monitor = conn.monitor()
    ready = threading.Event()

    def watch() -> None:
        with monitor as m:
            ready.set()
            for event in m.listen():
                if stop.is_set():
                    return
                name = event["command"].split(" ", 1)[0].strip('"').upper()
                if event.get("client_type") == "lua":
                    inside[0] += 1
                else:
                    sent[name] = sent.get(name, 0) + 1

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    ready.wait(10)
    time.sleep(0.5)
    before = dict(sent), inside[0]
    run_evalq(cluster, base_url, n, out)
    time.sleep(1.0)
    stop.set()
    conn.ping()  # one more line wakes the monitor up
    got = {k: v - before[0].get(k, 0) for k, v in sent.items()}
    return sum(got.values()), inside[0] - before[1], got


def start_sim(latency: float, slots: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "evalq.sim", "--region", f"{REGION}:0:0:{port}",
                             "--latency", str(latency), "--slots", str(slots), "--rate-headers", "none"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    url = proc.stdout.readline().split()[1]
    return proc, url


def start_moto() -> tuple[subprocess.Popen, str, Path]:
    port = free_port()
    log = Path(tempfile.mkstemp(prefix="evalq-bench-moto-", suffix=".log")[1])
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=open(log, "wb"), start_new_session=True,
                            env={**os.environ, **AWS})
    import boto3
    import botocore

    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="testing",
                         aws_secret_access_key="testing").create_bucket(Bucket="bench")
            return proc, url, log
        except botocore.exceptions.EndpointConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def judged_on(workdir: Path, name: str, judges: int, env: dict[str, str], base_url: str, n: int,
              chunk_size: int | None) -> None:
    """N items judged on a cluster of its own whose job store ``env`` names (this process's too)."""
    os.environ.update(env)
    cluster = Cluster(workdir / name, judges, env)
    try:
        run_evalq(cluster, base_url, n, workdir / f"out-{name}", chunk_size)
    finally:
        cluster.close()


def store_counts(workdir: Path, base_url: str, n: int, judges: int, chunk_size: int | None = None) -> dict:
    """Parts and store requests of N judged items, local store and S3 (moto); ``chunk_size``: the
    job's (None: as planned)."""
    found = {}
    tag = f"-{chunk_size}" if chunk_size else ""
    store = workdir / f"store{tag}"
    judged_on(workdir, f"local{tag}", judges, {"EVALQ_STORE": str(store)}, base_url, n, chunk_size)
    parts = list(store.rglob("records/entry=*/*.parquet"))
    found["local"] = {"parts": len(parts), "items_per_part": n / max(1, len(parts))}
    moto, url, log = start_moto()
    try:
        judged_on(workdir, f"s3{tag}", judges, {"EVALQ_STORE": "s3://bench/evalq", "EVALQ_STORE_ENDPOINT_URL": url,
                                                **AWS}, base_url, n, chunk_size)
        lines = log.read_text(errors="replace").splitlines()
        puts = sum(1 for x in lines if '"PUT /bench/' in x and "/records/" in x and "/pending-" not in x)
        # a chunk's pending part (its group's part not written yet): written, read by the group's writer, removed
        pending = sum(1 for x in lines if "/pending-" in x)
        # a part read (200), and a chunk's look, as it starts, for a part of its own not written yet (404)
        gets = sum(1 for x in lines if '"GET /bench/' in x and "/records/" in x and '" 200' in x
                   and "/pending-" not in x)
        probes = sum(1 for x in lines if '"GET /bench/' in x and "/records/" in x and '" 404' in x
                     and "/pending-" not in x)
        heads = sum(1 for x in lines if '"HEAD /bench/' in x and "/records/" in x)
        found["s3"] = {"puts": puts, "gets": gets, "probes": probes, "heads": heads, "pending": pending,
                       "requests": len([x for x in lines if '"' in x])}
    finally:
        os.environ.pop("EVALQ_STORE_ENDPOINT_URL", None)
        for k in ("EVALQ_STORE",):
            os.environ.pop(k, None)
        moto.terminate()
        moto.wait(10)
    return found


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--sdk-loop":
        print(json.dumps(sdk_loop(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="items (one judge call each) of the larger run")
    parser.add_argument("--n0", type=int, default=400, help="items of the smaller run (marginal CPU)")
    parser.add_argument("--latency", type=float, default=0.05, help="judge-sim's seconds per call")
    parser.add_argument("--slots", type=int, default=512, help="judge-sim's calls served at once")
    parser.add_argument("--threads", type=int, default=8, help="the SDK loop's threads")
    parser.add_argument("--workers", default="1,2", help="judge worker processes to measure (comma-separated)")
    parser.add_argument("--store-n", type=int, default=20_000, help="items of the store runs (a judge entry's "
                        "chunks reach 1,024 items from 16,384 items on)")
    parser.add_argument("--no-store", action="store_true", help="skip the parts and store requests")
    parser.add_argument("--store-chunks", default="0,50", help="the store runs' chunk sizes (0: as planned; "
                        "comma-separated)")
    parser.add_argument("--no-load", action="store_true", help="skip the CPU and Redis measure (the store runs only)")
    args = parser.parse_args()
    os.environ[KEY_ENV] = "bench"
    os.environ.setdefault("EVALQ_CACHE_DIR", tempfile.mkdtemp())
    workdir = Path(tempfile.mkdtemp(prefix="evalq-bench-path-"))
    workers = [int(w) for w in args.workers.split(",")]
    print(f"judge path: coherence (JSON schema), {args.n0} and {args.n} items; CPU per call marginal between them; "
          f"{os.cpu_count()} CPUs")
    rows = []
    for latency in (() if args.no_load else (args.latency, 0.0)):
        sim, url = start_sim(latency, args.slots)
        try:
            small, large = run_sdk(url, args.n0, args.threads), run_sdk(url, args.n, args.threads)
            per = (large["cpu"] - small["cpu"]) / (args.n - args.n0)
            sdk_ms = per * 1000
            rows.append((latency, f"SDK loop, {args.threads} threads", large["n"] / large["wall"], sdk_ms, None, None))
            for k in workers:
                cluster = Cluster(workdir / f"c{latency}-{k}", k, {})
                try:
                    run_evalq(cluster, url, 20, workdir / f"warm{latency}-{k}")  # imports, scripts, connections
                    a = run_evalq(cluster, url, args.n0, workdir / f"a{latency}-{k}")
                    b = run_evalq(cluster, url, args.n, workdir / f"b{latency}-{k}")
                    commands = count_commands(cluster, url, args.n, workdir / f"m{latency}-{k}") if latency else None
                finally:
                    cluster.close()
                ms = (b["cpu"] - a["cpu"]) / (args.n - args.n0) * 1000
                redis_ms = (b["redis"] - a["redis"]) / (args.n - args.n0) * 1000
                assert b["errors"] == 0 and a["errors"] == 0, (a, b)
                rows.append((latency, f"evalq, {k} judge worker(s)", b["n"] / b["wall"], ms, redis_ms, commands,
                             ms / sdk_ms))
        finally:
            sim.terminate()
            sim.wait(10)
    print(f"{'judge-sim latency':>18} | {'client':28} | {'calls/s':>8} | {'CPU ms/call':>11} | {'x SDK':>5} | "
          f"{'Redis CPU ms/call':>17} | Redis commands/item (sent; inside scripts)")
    for row in rows:
        latency, who, rate, ms, redis_ms, commands = row[:6]
        ratio = f"{row[6]:5.2f}" if len(row) > 6 else "  1.0"
        cmd = (f"{commands[0] / args.n:5.1f}; {commands[1] / args.n:5.1f}" if commands else "")
        print(f"{latency * 1000:>15.0f} ms | {who:28} | {rate:8.0f} | {ms:11.2f} | {ratio} | "
              f"{'' if redis_ms is None else f'{redis_ms:17.2f}'} | {cmd}")
    for row in rows:
        if row[5]:
            top = sorted(row[5][2].items(), key=lambda kv: -kv[1])[:12]
            print(f"  commands sent, {row[1]}, per item: " + ", ".join(f"{k} {v / args.n:.2f}" for k, v in top))
    for size in ([] if args.no_store else [int(c) or None for c in args.store_chunks.split(",")]):
        sim, url = start_sim(0.0, args.slots)
        try:
            counts = store_counts(workdir, url, args.store_n, 1, size)
        finally:
            sim.terminate()
            sim.wait(10)
        local, s3 = counts["local"], counts["s3"]
        scale = 100_000 / args.store_n
        print(f"store, {args.store_n} items, chunks {'as planned' if size is None else f'of {size}'}: local "
              f"{local['parts']} parts ({local['items_per_part']:.0f} items a part; "
              f"{local['parts'] * scale:,.0f} per 100,000 items); S3 record parts: {s3['puts']} PUT, "
              f"{s3['gets']} GET ({s3['gets'] / max(1, s3['puts']):.1f} reads a part), {s3['probes']} GET of a "
              f"part not written yet (a chunk run's look as it starts), {s3['heads']} HEAD, {s3['pending']} "
              f"requests of pending parts (PUT, GET, DELETE, and a chunk run's look); "
              f"{s3['requests']} S3 requests in all ({s3['requests'] * scale:,.0f} per 100,000 items)")


if __name__ == "__main__":
    main()
