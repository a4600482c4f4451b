"""Fair share between jobs on one cluster, against judge-sim with a strict TPM.

A private Redis, one judge worker (16 threads) on one region, a jobs worker (the sweeper);
jobs of the coherence metric (one judge call per item, 4 items per chunk). Prints, measured
in this run:

1. a small job alone, and the same job submitted 2 s after a big one (goal: within 2x of
   alone plus one chunk);
2. three jobs with weights 2:1:1 at once, on a region of their own (the first part's still
   counts its tokens in its window): each one's share of the tokens while all three run
   (goal: within 5 points of 50/25/25) and the region's utilisation (goal: >= 95%);
3. a high-priority job submitted behind a big normal backlog, and alone;
4. what the broker holds for a judge job of --items instances: the queue list's memory with
   every chunk sent at once (the old way: EVALQ_WINDOW larger than the plan) and with
   windows (the queue's window plus the plan's descriptors in Redis).

    .venv/bin/python bench/bench_fairness.py [--items 1000000] [--tpm 600000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from evalq.cli.embedded import EmbeddedRedis  # noqa: E402
from evalq.orchestrator.submit import submit  # noqa: E402
from evalq.shared.cluster import keys  # noqa: E402
from evalq.shared.job.schema import parse_job  # noqa: E402
from evalq.sim import JudgeSim, Region  # noqa: E402

os.environ.setdefault("EVALQ_ENDPOINTS", "*=http://127.0.0.1:*")
KEY_ENV = "BENCH_FAIR_API_KEY"
FILLER = "The answer explains the product in a few sentences and cites the context. " * 4


def worker(url: str, logdir: Path, queues: str, concurrency: int, name: str) -> subprocess.Popen:
    log = open(logdir / f"{name}.log", "wb")
    return subprocess.Popen([sys.executable, "-m", "evalq.cli", "worker", "--broker", url, "--queues", queues,
                             "--concurrency", str(concurrency), "-n", f"{name}@%h", "-l", "WARNING"],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def judge_job(sim: JudgeSim, tpm: int, n: int, region: str = "lab", **scheduling):
    return parse_job({
        "instances": [{"id": str(i), "input": f"Question {i}?", "actual-output": f"{FILLER} {uuid.uuid4().hex}"}
                      for i in range(n)],
        "judging": {"cache": False},
        "judges": {"sim": {"provider": "openai", "model": "judge-sim", "api_key_env": KEY_ENV, "max_tokens": 60,
                           "deployments": [{"region": region, "base_url": sim.base_url(region), "tpm": tpm,
                                            "rpm": 100_000}]}},
        "metrics": [{"id": "coherence", "parameters": {"judge": "sim"}}],
        "scheduling": scheduling})


def wait_done(r: redis.Redis, job_id: str, timeout: float = 900) -> float:
    deadline = time.monotonic() + timeout
    while r.get(keys.status(job_id)) not in (b"done", b"failed", b"cancelled"):
        if time.monotonic() > deadline:
            raise TimeoutError(job_id)
        time.sleep(0.05)
    return time.monotonic()


def tokens(r: redis.Redis, job_id: str) -> int:
    acct = r.hgetall(keys.accounting(job_id, "coherence@0"))
    return int(acct.get(b"prompt_tokens", 0)) + int(acct.get(b"completion_tokens", 0))


def timed(r, url, sim, tpm, tmp, n, **sched) -> float:
    t0 = time.monotonic()
    job_id = submit(r, url, judge_job(sim, tpm, n, **sched), out=str(tmp / uuid.uuid4().hex))
    return wait_done(r, job_id) - t0


def behind(r, url, sim, tpm, tmp, big_n: int, small_n: int, **sched) -> float:
    big = submit(r, url, judge_job(sim, tpm, big_n), out=str(tmp / uuid.uuid4().hex))
    time.sleep(2.0)
    t = timed(r, url, sim, tpm, tmp, small_n, **sched)
    wait_done(r, big)
    return t


def shares(r, url, sim, tpm, tmp, n: int) -> tuple[dict, float]:
    # a region of its own: the one the other parts used still counts their tokens in its window
    jobs = {label: submit(r, url, judge_job(sim, tpm, n, region="shares", tenant="t", weight=w),
                          out=str(tmp / uuid.uuid4().hex))
            for label, w in (("w2", 2), ("w1a", 1), ("w1b", 1))}
    time.sleep(5.0)  # past the start: the first windows
    t0, start, a0 = time.monotonic(), {w: tokens(r, j) for w, j in jobs.items()}, admitted(sim)
    while all(r.get(keys.status(j)) == b"running" for j in jobs.values()) and time.monotonic() - t0 < 60:
        time.sleep(0.25)
    t1, end, a1 = time.monotonic(), {w: tokens(r, j) for w, j in jobs.items()}, admitted(sim)
    used = {w: end[w] - start[w] for w in jobs}
    total = sum(used.values())
    for j in jobs.values():
        wait_done(r, j)
    # utilisation as the provider counts it (tokens it admitted against its TPM), as bench_judge.py does
    return {w: used[w] / total for w in jobs}, (a1 - a0) / (tpm * (t1 - t0) / 60)


def admitted(sim: JudgeSim) -> int:
    return sim.stats()["shares"]["admitted_tokens"]


def broker_memory(items: int, url: str, sim: JudgeSim, tpm: int, tmp: Path) -> dict:
    r = redis.Redis.from_url(url)
    r.delete(keys.sched("judge.lab", "out"))  # what the earlier parts left out was lost with their workers
    out = {}
    job = judge_job(sim, tpm, items)
    for label, window in (("every chunk sent", str(10 ** 9)), ("windows", "")):
        if window:
            os.environ["EVALQ_WINDOW"] = window
        else:
            os.environ.pop("EVALQ_WINDOW", None)
        job_id = submit(r, url, job, out=str(tmp / uuid.uuid4().hex))
        queue = r.memory_usage("judge.lab", samples=0) or 0
        pending = r.memory_usage(keys.pending(job_id, "judge.lab"), samples=0) or 0
        out[label] = {"queue_mib": queue / 2 ** 20, "pending_mib": pending / 2 ** 20, "messages": r.llen("judge.lab")}
        r.delete("judge.lab", keys.pending(job_id, "judge.lab"), keys.instances(job_id),
                 keys.sched("judge.lab", "out"))
        r.set(keys.status(job_id), "cancelled")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1_000_000, help="instances of the broker-memory job")
    parser.add_argument("--tpm", type=int, default=600_000, help="the region's tokens per minute")
    parser.add_argument("--skip-memory", action="store_true", help="leave out part 4")
    args = parser.parse_args()
    print(f"window: EVALQ_WINDOW_FACTOR={os.environ.get('EVALQ_WINDOW_FACTOR', 'default')}, "
          f"EVALQ_WINDOW_FLOOR={os.environ.get('EVALQ_WINDOW_FLOOR', 'default')}, "
          f"EVALQ_WINDOW={os.environ.get('EVALQ_WINDOW', 'unset')}; TPM {args.tpm:,}")
    os.environ[KEY_ENV] = "bench"
    os.environ.setdefault("EVALQ_CACHE_DIR", tempfile.mkdtemp())
    with tempfile.TemporaryDirectory() as tmp, \
            JudgeSim([Region(name, tpm=args.tpm, rpm=100_000) for name in ("lab", "shares")], latency=0.1,
                     jitter=0.05, seed=3) as sim:
        tmp = Path(tmp)
        server = EmbeddedRedis(tmp)
        server.start()
        r = redis.Redis.from_url(server.url)
        procs = [worker(server.url, tmp, "judge.lab,judge.shares", 16, f"judge{uuid.uuid4().hex[:4]}"),
                 worker(server.url, tmp, "evalq.jobs", 1, f"jobs{uuid.uuid4().hex[:4]}")]
        try:
            time.sleep(4.0)  # the workers announce their slots
            timed(r, server.url, sim, args.tpm, tmp, 12)  # warm-up: imports, connections
            alone = timed(r, server.url, sim, args.tpm, tmp, 12)
            chunk = alone / 3
            after = behind(r, server.url, sim, args.tpm, tmp, 600, 12)
            print(f"1. small job (12 items): alone {alone:.1f} s, 2 s after a 600-item job {after:.1f} s "
                  f"(goal <= 2 x alone + one chunk = {2 * alone + chunk:.1f} s)")
            got, utilisation = shares(r, server.url, sim, args.tpm, tmp, 600)
            print("2. weights 2:1:1, token shares while all three run: "
                  + ", ".join(f"{100 * got[w]:.1f}%" for w in got)
                  + f" (goal 50/25/25 within 5 points); region utilisation {100 * utilisation:.1f}% (goal >= 95%)")
            high_alone = timed(r, server.url, sim, args.tpm, tmp, 12, priority="high")
            high_behind = behind(r, server.url, sim, args.tpm, tmp, 600, 12, priority="high")
            print(f"3. high job (12 items): alone {high_alone:.1f} s, behind a 600-item normal job {high_behind:.1f} s")
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(30)
        mem = {} if args.skip_memory else broker_memory(args.items, server.url, sim, args.tpm, tmp)
        for label, m in mem.items():
            print(f"4. {args.items:,}-item judge job, {label}: {m['messages']:,} messages, queue list "
                  f"{m['queue_mib']:.1f} MiB, chunks waiting in Redis {m['pending_mib']:.1f} MiB")
        server.stop()


if __name__ == "__main__":
    main()
