"""Judge calls and tokens per item, per metric, on a fixed set.

Twenty synthetic RAG items (a question, a 3-claim answer, a 2-claim reference,
two context passages; judge-sim markers fix what the judge answers, so the
number of calls is the same on every run) are scored by each judge metric in a
job of its own, then by the four separate harm metrics against content_safety
and by the three claims metrics together (claims shared through the job's
memo), all measured in this run. Tokens are judge-sim's count (ceil(bytes/4) + 4
per message), close to but not exactly a provider's.

    .venv/bin/python bench/bench_judge_costs.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evalq.cli.embedded import EmbeddedCluster  # noqa: E402
from evalq.cli.run import run_job  # noqa: E402
from evalq.shared.job.schema import parse_job  # noqa: E402
from evalq.sim import JudgeSim, Region  # noqa: E402

# the workers may send the bench key to judge-sim on loopback (their allow-list)
os.environ.setdefault("EVALQ_ENDPOINTS", "*=http://127.0.0.1:*")
KEY_ENV = "BENCH_COST_API_KEY"
N = 20

ALONE = ["coherence", "groundedness", "similarity", "violence", "content_safety", "protected_material",
         "indirect_attack", "informationless", "claims_recall", "claims_precision", "claims_f1", "faithfulness",
         "context_relevancy", "rubrics_fc"]
TOGETHER = {"four harm metrics": ["hate_unfairness", "sexual", "violence", "self_harm"],
            "claims_recall + claims_precision + claims_f1": ["claims_recall", "claims_precision", "claims_f1"]}


def instances() -> list[dict]:
    out = []
    for i in range(N):
        out.append({
            "id": f"q{i}", "input": f"What does the trail guide say about route {i} in spring?",
            "context": [f"Route {i} is closed in early spring because of snow. [[sim:entails=closed_early]] "
                        "[[sim:bool=false]]",
                        f"Route {i} has a hut at the top that sells soup. [[sim:bool=false]]"],
            "actual-output": f"Route {i} is closed in early spring, it opens in May, and the hut sells tea. "
                             "[[sim:claims=closed_early;opens_may;hut_tea]] [[sim:entails=closed_early]] "
                             "[[sim:needed=closed_in_early]] [[sim:bool=false]] [[sim:severity=1]] [[sim:score=4]]",
            "expected-output": [f"Route {i} is closed in early spring; the hut sells soup. "
                                "[[sim:claims=closed_early;hut_soup]] [[sim:entails=closed_early]] "
                                "[[sim:contradicts=hut_tea]] [[sim:bool=false]]"]})
    return out


def run(metrics: list[str], sim: JudgeSim, broker: str, out: Path) -> list[dict]:
    job = {"instances": instances(), "judging": {"cache": False},
           "judges": {"sim": {"provider": "openai", "model": "judge-sim", "api_key_env": KEY_ENV, "max_tokens": 300,
                              "deployments": [{"region": "lab", "base_url": sim.base_url("lab"),
                                               "tpm": 50_000_000, "rpm": 1_000_000}]}},
           "metrics": [{"id": m, "parameters": {"judge": "sim"}} for m in metrics]}
    run_job(parse_job(job), out, broker=broker, progress=False, stall_timeout=300)
    return json.loads((out / "results.json").read_text())


def main() -> None:
    os.environ[KEY_ENV] = "bench"
    work = Path(tempfile.mkdtemp(prefix="evalq-bench-costs-"))
    rows = []
    with JudgeSim([Region("lab")], latency=0.002, seed=0) as sim, EmbeddedCluster(["judge.lab"]) as cluster:
        for metric in ALONE:
            sim.reset_stats()
            result = run([metric], sim, cluster.broker_url, work / metric)[0]
            stats = sim.stats("lab")
            rows.append((metric, stats["requests"] / N, (stats["prompt_tokens"] + stats["completion_tokens"]) / N,
                         result["judge"]["calls_per_item"]))
        together = []
        for label, metrics in TOGETHER.items():
            sim.reset_stats()
            run(metrics, sim, cluster.broker_url, work / label.replace(" ", "_").replace("+", ""))
            stats = sim.stats("lab")
            together.append((label, stats["requests"] / N,
                             (stats["prompt_tokens"] + stats["completion_tokens"]) / N))
    print(f"{N} items; judge-sim counts (calls and prompt+completion tokens per item)")
    print(f"{'metric, in a job of its own':46} {'calls/item':>10} {'tokens/item':>12}")
    for metric, calls, tokens, reported in rows:
        assert abs(calls - reported) < 1e-6, (metric, calls, reported)  # results.json says the same
        print(f"{metric:46} {calls:10.1f} {tokens:12.0f}")
    print(f"{'together, in one job':46} {'calls/item':>10} {'tokens/item':>12}")
    for label, calls, tokens in together:
        print(f"{label:46} {calls:10.1f} {tokens:12.0f}")


if __name__ == "__main__":
    main()
