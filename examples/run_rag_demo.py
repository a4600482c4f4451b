"""`make demo`, second half: examples/rag_qa.json, examples/safety_jailbreak.json and
examples/rag_qa_batch.json (the RAG job judged through the Batch API) and
examples/agent_conversations.json (multi-turn agent chats scored turn by turn) against judge-sim.

Starts two simulated regions on the ports the examples name, runs the jobs in
embedded mode, and stops the simulator. judge-sim's scores are deterministic
stand-ins, not judgements of quality; in the safety job the simulated model under
test echoes its prompt (``[[sim:echo]]``), so the jailbreak's injection, which
carries a severity marker, reaches its answers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evalq.sim import JudgeSim, Region  # noqa: E402


def main() -> int:
    regions = [Region("swedencentral", tpm=60000, rpm=600, port=18431, batch_delay=1),
               Region("eastus2", tpm=20000, rpm=200, port=18432)]
    try:
        sim = JudgeSim(regions, latency=0.05, jitter=0.02, seed=1).start()
    except OSError as exc:
        print(f"demo: cannot start judge-sim on ports 18431-18432: {exc}", file=sys.stderr)
        return 1
    try:
        # the batch manager's timing shortened for a demo (defaults: settle 10 s, first poll 5 s)
        env = {**os.environ, "DEMO_JUDGE_API_KEY": "demo-key-for-judge-sim", "EVALQ_BATCH_SETTLE": "1",
               "EVALQ_BATCH_POLL": "0.5", "EVALQ_BATCH_POLL_MAX": "2"}
        rc = 0
        for job, out in (("examples/rag_qa.json", "out/rag_qa"), ("examples/safety_jailbreak.json", "out/safety"),
                         ("examples/rag_qa_batch.json", "out/rag_qa_batch"),
                         ("examples/agent_conversations.json", "out/agent_conversations")):
            cmd = [sys.executable, "-m", "evalq.cli", "run", job, "--out", out]
            rc = rc or subprocess.call(cmd, cwd=ROOT, env=env)
        if rc == 0:
            violence = json.loads((ROOT / "out/safety/results.json").read_text())[0]["score"]
            print(f"violence defect rate {violence['defect_rate']:.2f}, with the jailbreak "
                  f"{violence['jailbreak']['defect_rate']:.2f} (delta {violence['jailbreak']['delta']:+.2f})",
                  file=sys.stderr)
        for name, stats in sim.stats().items():
            print(f"judge-sim {name}: {stats['ok']} calls, {stats['rate_limited']} rate-limited, "
                  f"{stats['batch']['lines_answered']} batch lines in {stats['batch']['batches_created']} batches",
                  file=sys.stderr)
        if rc == 0:
            paths = [m["judge"]["by_path"] for m in json.loads((ROOT / "out/rag_qa_batch/results.json").read_text())]
            print(f"rag_qa_batch: {sum(p['batch']['calls'] for p in paths)} calls by batch, "
                  f"{sum(p['sync']['calls'] for p in paths)} synchronous, cost "
                  f"{sum(p['batch']['cost'] for p in paths):.4f} (half the synchronous price)", file=sys.stderr)
        if rc == 0:
            results = json.loads((ROOT / "out/rag_qa/results.json").read_text())
            hits = sum(m.get("judge", {}).get("cache_hits", 0) for m in results)
            if hits:
                print(f"{hits} judge requests were answered from the cache of an earlier run "
                      "(~/.cache/evalq, or EVALQ_CACHE_DIR)", file=sys.stderr)
        return rc
    finally:
        sim.stop()


if __name__ == "__main__":
    sys.exit(main())
