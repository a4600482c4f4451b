"""Semantic robustness through a rate-limited endpoint model: N items x 5 perturbations, against
the model's TPM limit, in the same run as the loop fmeval runs (one process, one call after the
other, the SDK's retries on 429).

judge-sim serves the model in one region with a token limit over a 10 s window (the deployment
declares the same window: "TPM" below is tokens per 10 s, so the bench takes a minute, not six); evalq runs
an embedded cluster (private Redis, a generate.lab worker with 8 threads, a cpu worker). The job:
``semantic_robustness`` (task general, butter_finger, ``bertscore: false``), the model generating
each instance's output first. Per item: 1 generation + 5 perturbed inputs + the unperturbed input
(the generation's request: one call between them) + 1 repeat = 7 requests, 6 of them sent.

Reported for each: wall time, requests answered, 429s, tokens (judge-sim's count) and the budget's
floor (the tokens beyond the first window's worth, at the limit's rate: no client can be faster);
floor / wall is how close a run comes to the limit.

    .venv/bin/python bench/bench_robustness.py [N] [TPM]
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

from evalq.cli.embedded import EmbeddedCluster  # noqa: E402
from evalq.cli.run import run_job  # noqa: E402
from evalq.shared.fmeval.params import SemanticRobustnessParams  # noqa: E402
from evalq.shared.job.schema import parse_job  # noqa: E402
from evalq.sim import JudgeSim, Region  # noqa: E402
from evalq.workers.fmeval.robustness import perturbed_inputs  # noqa: E402

KEY_ENV = "BENCH_ROBUST_API_KEY"
TEMPLATE = "Answer in one short sentence: $model_input"
MAX_TOKENS = 40
WINDOW = 10


def instances(n: int) -> list[dict]:
    topics = ["the capital of France", "photosynthesis", "the speed of light", "the French revolution",
              "prime numbers", "the water cycle", "black holes", "the printing press"]
    return [{"id": f"q{i}", "input": f"Question {i}: what should a student know about {topics[i % len(topics)]}?"}
            for i in range(n)]


def model(sim: JudgeSim, tpm: int) -> dict:
    return {"provider": "openai", "model": "m", "api_key_env": KEY_ENV, "max_tokens": MAX_TOKENS,
            "prompt_template": TEMPLATE,
            "deployments": [{"region": "lab", "base_url": sim.base_url("lab"), "tpm": tpm, "rpm": 10_000,
                             "window_seconds": WINDOW}]}


def with_evalq(sim: JudgeSim, n: int, tpm: int, broker: str, out: Path) -> dict:
    job = {"instances": instances(n), "model": model(sim, tpm), "judging": {"cache": False},
           "metrics": [{"id": "semantic_robustness", "parameters": {"num_perturbations": 5, "bertscore": False}}]}
    t0 = time.perf_counter()
    run_job(parse_job(job), out, broker=broker, progress=False, stall_timeout=900)
    wall = time.perf_counter() - t0
    results = json.loads((out / "results.json").read_text())[0]
    assert results["n"] == n and results["n_errors"] == 0, results
    return {"wall": wall, **_counts(sim)}


def in_process(sim: JudgeSim, n: int) -> dict:
    """fmeval's way: one process asks for each answer in turn (the openai SDK retries a 429 after
    the Retry-After it is given, twice, then the record fails)."""
    import openai

    client = openai.OpenAI(base_url=sim.base_url("lab"), api_key="bench", max_retries=2)
    params = SemanticRobustnessParams(num_perturbations=5)
    failed = 0
    t0 = time.perf_counter()
    for inst in instances(n):
        prompts = [inst["input"], *perturbed_inputs(inst, params), inst["input"], inst["input"]]
        for text in prompts:
            try:
                client.chat.completions.create(model="m", max_tokens=MAX_TOKENS, temperature=0,
                                               messages=[{"role": "user", "content": TEMPLATE.replace(
                                                   "$model_input", text)}])
            except openai.RateLimitError:
                failed += 1
    return {"wall": time.perf_counter() - t0, "failed": failed, **_counts(sim)}


def _counts(sim: JudgeSim) -> dict:
    s = sim.stats("lab")
    return {"ok": s["ok"], "429": s["rate_limited"], "tokens": s["prompt_tokens"] + s["completion_tokens"]}


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    tpm = int(sys.argv[2]) if len(sys.argv) > 2 else 3_000
    os.environ[KEY_ENV] = "bench"
    work = Path(tempfile.mkdtemp(prefix="evalq-bench-robust-"))
    with JudgeSim([Region("lab", tpm=tpm, rpm=10_000)], api_key="bench", latency=0.05, seed=0,
                  window_seconds=WINDOW) as sim, \
            EmbeddedCluster(["generate.lab", "cpu"], concurrency=8) as cluster:
        evalq = with_evalq(sim, n, tpm, cluster.broker_url, work / "evalq")
        sim.reset_stats(clear_limits=True)
        time.sleep(1)
        loop = in_process(sim, n)
    print(f"{n} items x 5 perturbations (semantic_robustness, general), model limited to {tpm:,} tokens per "
          f"{WINDOW} s; judge-sim latency 50 ms")
    print(f"{'run':28} {'wall s':>7} {'answered':>8} {'429s':>5} {'tokens':>7} {'floor s':>7} {'floor/wall':>10}")
    for name, m in (("evalq, 8 generate threads", evalq), ("in-process loop (fmeval's)", loop)):
        floor = max(0, m["tokens"] - tpm) * WINDOW / tpm
        print(f"{name:28} {m['wall']:7.1f} {m['ok']:8d} {m['429']:5d} {m['tokens']:7d} {floor:7.1f} "
              f"{floor / m['wall']:10.2f}")
    if loop.get("failed"):
        print(f"the in-process loop lost {loop['failed']} answers to 429s after the SDK's retries")


if __name__ == "__main__":
    main()
