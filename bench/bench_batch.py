"""One nightly-style judge job, synchronously and through the Batch API, in the same run.

The 20 fixed RAG items of ``bench_judge_costs`` (judge-sim markers fix every verdict, so the
counts are exact) are scored by coherence, content_safety, faithfulness and claims_f1 with a
priced judge, first with ``judging.mode: sync``, then with ``batch``, on an embedded cluster
(private Redis, real workers) and judge-sim. Reported per mode: synchronous chat calls, batch
lines, batches, prompt + completion tokens (judge-sim's count), cost (results.json) and wall
time; and whether every value is the same.

judge-sim completes a batch ``--batch-delay`` seconds after its creation (here 2 s; a real
provider takes minutes to hours within its 24 h window), so the batch wall time below is
rounds x that delay plus the settle and poll times, not a provider's.

    .venv/bin/python bench/bench_batch.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

os.environ.setdefault("EVALQ_ENDPOINTS", "*=http://127.0.0.1:*")
# the batch manager's timing for a short bench (defaults: tick 2 s, settle 10 s, first poll 5 s)
os.environ.update({"EVALQ_BATCH_TICK": "0.2", "EVALQ_BATCH_SETTLE": "1", "EVALQ_BATCH_POLL": "0.5",
                   "EVALQ_BATCH_POLL_MAX": "2"})

from bench.bench_judge_costs import N, instances  # noqa: E402
from evalq.cli.embedded import EmbeddedCluster  # noqa: E402
from evalq.cli.run import run_job  # noqa: E402
from evalq.shared.job.schema import parse_job  # noqa: E402
from evalq.sim import JudgeSim, Region  # noqa: E402

KEY_ENV = "BENCH_BATCH_API_KEY"
METRICS = ["coherence", "content_safety", "faithfulness", "claims_f1"]
PRICE = {"input_per_1k": 0.0025, "output_per_1k": 0.01}  # gpt-4o's list price per 1k tokens (USD)
DELAY = 2.0


def job(mode: str, sim: JudgeSim) -> dict:
    return {"instances": instances(), "judging": {"cache": False, "mode": mode},
            "judges": {"sim": {"provider": "openai", "model": "judge-sim", "api_key_env": KEY_ENV, "max_tokens": 300,
                               "price": PRICE,
                               "deployments": [{"region": "lab", "base_url": sim.base_url("lab"),
                                                "tpm": 50_000_000, "rpm": 1_000_000,
                                                "batch": {"enqueued_tokens": 50_000_000}}]}},
            "metrics": [{"id": m, "parameters": {"judge": "sim"}} for m in METRICS]}


def measure(mode: str, sim: JudgeSim, broker: str, out: Path) -> dict:
    sim.reset_stats()
    t0 = time.perf_counter()
    run_job(parse_job(job(mode, sim)), out, broker=broker, progress=False, stall_timeout=600)
    wall = time.perf_counter() - t0
    stats = sim.stats("lab")
    results = json.loads((out / "results.json").read_text())
    log = {(r["metric"], r["instance_id"]): r.get("result", r.get("error"))
           for r in map(json.loads, (out / "log.jsonl").read_text().splitlines())}
    return {"sync calls": stats["requests"], "batch lines": stats["batch"]["lines_answered"],
            "batches": stats["batch"]["batches_created"],
            "tokens": stats["prompt_tokens"] + stats["completion_tokens"]
            + stats["batch"]["prompt_tokens"] + stats["batch"]["completion_tokens"],
            "cost": sum(e["judge"]["cost"] for e in results), "wall": wall, "log": log}


def main() -> None:
    os.environ[KEY_ENV] = "bench"
    work = Path(tempfile.mkdtemp(prefix="evalq-bench-batch-"))
    with JudgeSim([Region("lab", batch_delay=DELAY)], latency=0.002, seed=0) as sim, \
            EmbeddedCluster(["judge.lab"]) as cluster:
        sync = measure("sync", sim, cluster.broker_url, work / "sync")
        batch = measure("batch", sim, cluster.broker_url, work / "batch")
    same = sync["log"] == batch["log"]
    print(f"{N} items x {', '.join(METRICS)}; price {PRICE['input_per_1k']}/{PRICE['output_per_1k']} per 1k "
          f"(batch: half); judge-sim batch delay {DELAY:g} s")
    print(f"{'mode':6} {'sync calls':>10} {'batch lines':>11} {'batches':>7} {'tokens':>8} {'cost':>9} {'wall s':>7}")
    for mode, m in (("sync", sync), ("batch", batch)):
        print(f"{mode:6} {m['sync calls']:10d} {m['batch lines']:11d} {m['batches']:7d} {m['tokens']:8d} "
              f"{m['cost']:9.4f} {m['wall']:7.1f}")
    print(f"batch / sync: cost {batch['cost'] / sync['cost']:.2f}x, tokens {batch['tokens'] / sync['tokens']:.2f}x; "
          f"values identical: {same}")
    assert same, "batch mode gave other values than sync mode"


if __name__ == "__main__":
    main()
