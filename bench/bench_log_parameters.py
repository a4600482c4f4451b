"""What HarpIA's log format (every log.jsonl line reproduces its entry's parameters) costs, and
what ``"output": {"log_parameters": false}`` saves, for a job with the largest parameters a job
may have: a judge ``rubric`` with 22 examples of 4,000 characters (bounds.MAX_EXAMPLES x
MAX_EXAMPLE_CHARS), beside a BLEU entry.

The same job runs twice on one embedded cluster against judge-sim (unlimited region), with
the default and with ``log_parameters: false``; then, on the same Redis records, this process
times writing the outputs of each (what the final callback does) and prints the log sizes.

    .venv/bin/python bench/bench_log_parameters.py [N]        # default 300 instances
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

from evalq.cli.embedded import EmbeddedCluster  # noqa: E402
from evalq.cli.run import run_job  # noqa: E402
from evalq.shared.core import bounds  # noqa: E402
from evalq.shared.job.schema import parse_job  # noqa: E402
from evalq.sim import JudgeSim, Region  # noqa: E402


def job(n: int, sim: JudgeSim, log_parameters: bool) -> dict:
    examples = [{"score": k % 4, "output": f"example {k} " + "x" * (bounds.MAX_EXAMPLE_CHARS - 12),
                 "reason": "r"} for k in range(bounds.MAX_EXAMPLES)]
    return {"instances": [{"id": f"q{k}", "input": f"Question {k}?", "actual-output": f"answer {k % 7} here",
                           "expected-output": [f"answer {k % 5} here"]} for k in range(n)],
            "judges": {"sim": {"provider": "openai", "model": "judge-sim", "api_key_env": "BENCH_JUDGE_API_KEY",
                               "max_tokens": 60, "deployments": [{"region": "lab", "base_url": sim.base_url("lab"),
                                                                  "tpm": 200_000_000, "rpm": 1_000_000}]}},
            "judging": {"cache": False},
            "output": {"log_parameters": log_parameters},
            "metrics": [{"id": "bleu"},
                        {"id": "rubric", "parameters": {"judge": "sim", "scale_min": 0, "scale_max": 3,
                                                        "criteria": "Is the answer right?", "examples": examples}}]}


def main() -> None:
    import redis

    from evalq.results.outputs import run_info, write_outputs
    from evalq.shared.cluster import keys
    from evalq.shared.job.stored import stored_job as stored_spec
    from evalq.shared.data.storage import Destination

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    work = Path(tempfile.mkdtemp(prefix="bench-logparams-"))
    os.environ.update({"BENCH_JUDGE_API_KEY": "bench", "EVALQ_HISTORY": "off"})
    rows = []
    with JudgeSim([Region("lab")], seed=1) as sim:
        jobs = [parse_job(job(n, sim, flag), source="bench-logparams.json") for flag in (True, False)]
        with EmbeddedCluster(jobs[0].queues, env={"EVALQ_HISTORY": "off", "BENCH_JUDGE_API_KEY": "bench"}) as cluster:
            r = redis.Redis.from_url(cluster.broker_url)
            for flag, parsed in zip((True, False), jobs):
                out = work / f"out-{flag}"
                run_job(parsed, out, broker=cluster.broker_url, progress=False, stall_timeout=600)
                job_id = json.loads((out / "run.json").read_text())["job_id"]
                spec, summary = stored_spec(r, job_id), json.loads(r.get(keys.summary(job_id)))
                t0 = time.perf_counter()
                write_outputs(r, spec, job_id, summary, run_info(spec, job_id, None), Destination(str(work / f"again-{flag}")))
                seconds = time.perf_counter() - t0
                lines = (out / "log.jsonl").read_text().splitlines()
                rubric = [line for line in lines if json.loads(line)["metric"] == "rubric"]
                bleu = [line for line in lines if json.loads(line)["metric"] == "bleu"]
                rows.append((flag, (out / "log.jsonl").stat().st_size, sum(map(len, rubric)) / len(rubric),
                             sum(map(len, bleu)) / len(bleu), seconds))
    print(f"{n} instances x (bleu, rubric with {bounds.MAX_EXAMPLES} examples of {bounds.MAX_EXAMPLE_CHARS} chars)")
    for flag, size, rubric_line, bleu_line, seconds in rows:
        print(f"  log_parameters {str(flag).lower():5}: log.jsonl {size / 2**20:8.2f} MiB; a rubric line {rubric_line:9,.0f} B, "
              f"a bleu line {bleu_line:5,.0f} B; writing the outputs {seconds:6.2f} s")
    (on, off) = rows
    print(f"  per 100,000 instances: {on[2] * 1e5 / 2**30:.1f} GiB of rubric lines with parameters, "
          f"{off[2] * 1e5 / 2**20:.1f} MiB without; outputs written {on[4] / off[4]:.1f}x slower with them")


if __name__ == "__main__":
    main()
