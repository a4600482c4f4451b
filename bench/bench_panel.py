"""A panel of three judges against its members alone (issue 61), measured in the same run.

N items rated by ``coherence`` on judge-sim (three models: faithful, lenient by a point, noisy), on an
embedded cluster (a real redis-server, local judge workers): first each member alone, then the three
as one panel (median). Prints per run the wall time, the calls and prompt+completion tokens judge-sim
counted, and for the panel its alpha and effective votes. The panel's goals: tokens no more than the
three single-judge runs together; wall time near the slowest member's alone (its members' calls go
in parallel), not their sum.

    .venv/bin/python bench/bench_panel.py [--n 10000] [--latency 0.02]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evalq.cli.embedded import EmbeddedCluster  # noqa: E402
from evalq.cli.run import run_job  # noqa: E402
from evalq.shared.job.schema import parse_job  # noqa: E402
from evalq.sim import Biases, JudgeSim, Region  # noqa: E402

os.environ.setdefault("EVALQ_ENDPOINTS", "*=http://127.0.0.1:*")
KEY_ENV = "BENCH_PANEL_API_KEY"
MODELS = {"faithful": Biases(), "lenient": Biases(leniency=1), "noisy": Biases(noise=0.4)}


def run(sim: JudgeSim, broker: str, out: Path, n: int, judge) -> tuple[float, dict]:
    instances = [{"id": f"q{i}", "input": f"Question {i} about the report?",
                  "actual-output": f"Answer {i}: the report says so. [[sim:score={1 + (i * 7) % 5}]]"} for i in range(n)]
    judges = {m: {"provider": "openai", "model": m, "api_key_env": KEY_ENV, "output": "json_schema", "max_tokens": 100,
                  "deployments": [{"region": "jury", "base_url": sim.base_url("jury"), "tpm": 200_000_000,
                                   "rpm": 1_000_000}]} for m in MODELS}
    job = {"instances": instances, "judges": judges, "judging": {"cache": False},
           "metrics": [{"id": "coherence", "parameters": {"judge": judge, "panel_aggregate": "median"}
                        if isinstance(judge, list) else {"judge": judge}}]}
    start = time.perf_counter()
    run_job(parse_job(job), out, broker=broker, progress=False, stall_timeout=600)
    return time.perf_counter() - start, json.loads((out / "results.json").read_text())[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--latency", type=float, default=0.02, help="judge-sim's seconds per call")
    args = parser.parse_args()
    os.environ[KEY_ENV] = "bench"
    work = Path(tempfile.mkdtemp(prefix="evalq-bench-panel-"))
    rows = []
    with JudgeSim([Region("jury")], latency=args.latency, seed=0, biases=MODELS) as sim, \
            EmbeddedCluster(["judge.jury"]) as cluster:
        for judge in [*MODELS, list(MODELS)]:
            sim.reset_stats()
            label = "panel of three (median)" if isinstance(judge, list) else f"{judge} alone"
            wall, result = run(sim, cluster.broker_url, work / label.split()[0], args.n, judge)
            stats = sim.stats("jury")
            rows.append((label, wall, stats["requests"], stats["prompt_tokens"] + stats["completion_tokens"],
                         result["score"].get("panel"), result["score"]["mean"]))
    print(f"{args.n} items x coherence on judge-sim ({args.latency * 1000:.0f} ms per call), embedded cluster")
    print(f"{'run':26} {'wall s':>8} {'calls':>8} {'tokens':>10} {'mean':>6}  panel")
    for label, wall, calls, tokens, panel, mean in rows:
        said = f"alpha {panel['alpha']:.3f}, effective votes {panel['effective_votes']:.2f}" if panel else ""
        print(f"{label:26} {wall:8.1f} {calls:8d} {tokens:10d} {mean:6.3f}  {said}")
    singles = rows[:3]
    panel = rows[3]
    print(f"panel tokens / three single runs: {panel[3] / sum(r[3] for r in singles):.3f}; "
          f"panel wall / slowest member alone: {panel[1] / max(r[1] for r in singles):.2f}")


if __name__ == "__main__":
    main()
