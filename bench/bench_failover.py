"""What a Redis fault costs a night (issue 72): each fault of ``tests.faults.drill`` run
``--runs`` times (default 5), each at a random point between 20% and 80% of the judging of a job
of bleu and coherence (judge-sim, 0.1 s a call) on a loopback cluster with a job store, and read
by the cluster's journal (``evalq.shared.cluster.journal``). Prints per fault: runs that ended as
undisturbed (exit 0, every item once with its value), chunks lost (must be 0), chunks run twice,
judge calls paid again (and the in-flight bound), workers the drill's supervisor started again
(one that exited), the time from the fault to progress again and the whole job's time, p50/p95;
and, measured in the same run, the same job undisturbed.

    .venv/bin/python bench/bench_failover.py [--runs 5] [--faults flushall replaced ...] [--n 48]

``partition`` needs root and iproute2 (a network namespace); it is left out elsewhere, saying so.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.faults import drill  # noqa: E402


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))] if values else float("nan")


def intact(out: drill.Outcome) -> bool:
    """Exit 0, and every (instance, entry) once with what the undisturbed job gives."""
    n = len(out.job["instances"])
    once = len({(line["instance_id"], line["metric"]) for line in out.log}) == len(out.log) == 2 * n
    scores = {line["instance_id"]: line["result"]["score"] for line in out.log if line["metric"] == "coherence"}
    return out.returncode == 0 and once and scores == {f"c{i}": 1 + i % 5 for i in range(n)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--faults", nargs="+", default=list(drill.FAULTS), choices=drill.FAULTS)
    parser.add_argument("--n", type=int, default=48, help="instances (each scored by bleu and coherence)")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    faults = [f for f in args.faults if f != "partition" or not drill.can_partition()]
    if len(faults) < len(args.faults):
        print(f"partition left out: {drill.can_partition()}")
    with tempfile.TemporaryDirectory() as tmp:
        base = [drill.run(Path(tmp) / f"none{i}", "none", seed=rng.randrange(1 << 30), n=args.n) for i in range(2)]
        undisturbed = statistics.median(out.seconds for out in base)
        print(f"undisturbed: {args.n} instances x (bleu, coherence), job {undisturbed:.1f} s (median of 2), "
              f"{sum(intact(out) for out in base)}/2 intact")
        print(f"{'fault':<10} {'intact':>6} {'lost':>5} {'twice':>5} {'repaid':>7} {'bound':>6} {'restarts':>8} "
              f"{'recover p50':>11} {'p95':>6} {'job p50':>8} {'p95':>6}")
        for fault in faults:
            outs, failed = [], 0
            for i in range(args.runs):
                try:
                    out = drill.run(Path(tmp) / f"{fault}{i}", fault, seed=rng.randrange(1 << 30), n=args.n)
                except Exception as exc:  # a drill that could not finish (a worker that never answered again)
                    failed += 1
                    print(f"  {fault} run {i + 1}: FAILED: {type(exc).__name__}: {exc}", flush=True)
                    continue
                outs.append(out)
                print(f"  {fault} run {i + 1} at {out.point:.0%}: {out.verdict.line()}, {out.restarts} workers "
                      f"restarted, job {out.seconds:.1f} s"
                      + ("" if intact(out) else f"  NOT INTACT (exit {out.returncode}): {out.err[-300:]}"),
                      flush=True)
            recover = [o.verdict.recovered_after for o in outs if o.verdict.recovered_after is not None]
            seconds = [o.seconds for o in outs]
            print(f"{fault:<10} {sum(intact(o) for o in outs):>3}/{len(outs) + failed:<2} "
                  f"{sum(len(o.verdict.lost) for o in outs):>5} {sum(len(o.verdict.doubled) for o in outs):>5} "
                  f"{sum(o.verdict.repaid for o in outs):>7} {sum(o.verdict.in_flight for o in outs):>6} "
                  f"{sum(o.restarts for o in outs):>8} "
                  f"{pct(recover, 0.5):>9.1f} s {pct(recover, 0.95):>4.1f} s {pct(seconds, 0.5):>6.1f} s "
                  f"{pct(seconds, 0.95):>4.1f} s", flush=True)


if __name__ == "__main__":
    main()
