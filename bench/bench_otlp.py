"""Reading production traces (issue 41): OTLP JSON export files of N spans (half of them GenAI model
calls in the conventions' form, a quarter agent spans and tool spans, a quarter HTTP spans), read
as a trace dataset by `evalq validate` in a subprocess (every span decoded, selected, spooled, made an
instance and checked), against the floor of any reader in the same run: `json.loads` of every line
in one process. Prints spans per second and the reader's peak memory at each size: bounded memory
means the peak does not grow with N.

    .venv/bin/python bench/bench_otlp.py [--sizes 100000 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PER_REQUEST = 100  # spans per export request (one line), as a Collector batches them


def kv(key, value):
    return {"key": key, "value": {"stringValue": value} if isinstance(value, str) else {"intValue": str(value)}}


def spans(rng: random.Random, t0: int):
    """Traces of four spans: an HTTP handler, an agent, its model call and a tool call."""
    n = 0
    while True:
        trace = f"{rng.getrandbits(128):032x}"
        ids = [f"{rng.getrandbits(64):016x}" for _ in range(4)]
        start = t0 + n * 1_000_000
        q = f"question {n} about order {rng.randint(1, 10**6)}"
        messages = json.dumps([{"role": "user", "parts": [{"type": "text", "content": q}]}])
        answer = json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": f"answer {n} " * 8}]}])
        base = {"traceId": trace, "startTimeUnixNano": str(start), "endTimeUnixNano": str(start + 900_000)}
        yield {**base, "spanId": ids[0], "name": "POST /chat", "kind": 2,
               "attributes": [kv("http.request.method", "POST"), kv("http.response.status_code", 200)]}
        yield {**base, "spanId": ids[1], "parentSpanId": ids[0], "name": "invoke_agent support",
               "attributes": [kv("gen_ai.operation.name", "invoke_agent"), kv("gen_ai.agent.name", "support")]}
        yield {**base, "spanId": ids[2], "parentSpanId": ids[1], "name": "chat gpt-4o-mini",
               "attributes": [kv("gen_ai.operation.name", "chat"), kv("gen_ai.request.model", "gpt-4o-mini"),
                              kv("gen_ai.input.messages", messages), kv("gen_ai.output.messages", answer),
                              kv("gen_ai.usage.input_tokens", 40), kv("gen_ai.usage.output_tokens", 30)]}
        yield {**base, "spanId": ids[3], "parentSpanId": ids[1], "name": "execute_tool lookup",
               "attributes": [kv("gen_ai.operation.name", "execute_tool"), kv("gen_ai.tool.name", "lookup")]}
        n += 1


def write(path: Path, n: int) -> int:
    rng, made = random.Random(5), 0
    gen = spans(rng, 1_764_000_000_000_000_000)
    with open(path, "w") as f:
        while made < n:
            batch = [next(gen) for _ in range(min(PER_REQUEST, n - made))]
            made += len(batch)
            f.write(json.dumps({"resourceSpans": [{"resource": {"attributes": [kv("service.name", "support")]},
                                                   "scopeSpans": [{"scope": {"name": "app"}, "spans": batch}]}]}))
            f.write("\n")
    return path.stat().st_size


def floor(path: Path) -> float:
    t0 = time.perf_counter()
    with open(path) as f:
        for line in f:
            json.loads(line)
    return time.perf_counter() - t0


WRAPPER = """import resource, subprocess, sys
done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
sys.stderr.write(done.stderr)
print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
print(done.stdout)
"""


def evalq_read(job: Path) -> tuple[float, float, str]:
    """(seconds, peak RSS in MiB of the reading process, what it said): `evalq validate` run under a
    wrapper of its own, whose children's peak is that one process's."""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", WRAPPER, sys.executable, "-m", "evalq.cli", "validate", str(job)],
                          cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    head, _, said = done.stdout.partition("\n")
    rc, peak = head.split()
    assert rc == "0", done.stderr[-2000:]
    said = next((line for line in said.splitlines() if "OTLP traces" in line), "")
    return wall, int(peak) / 1024, said


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores; spans per export line: {PER_REQUEST}")
    with tempfile.TemporaryDirectory(prefix="evalq-bench-otlp-") as tmp:
        for n in sorted(args.sizes):
            data = Path(tmp) / f"traces-{n}.jsonl"
            size = write(data, n)
            job = Path(tmp) / f"job-{n}.json"
            job.write_text(json.dumps({"dataset": {"uri": str(data), "format": "otlp"},
                                       "metrics": [{"id": "toxicity"}]}))
            base = floor(data)
            wall, peak, said = evalq_read(job)
            print(f"N={n:>9,} spans ({size / 1e6:,.0f} MB): json.loads of every line {base:7.2f} s "
                  f"({n / base:>9,.0f} spans/s); evalq read+select+spool+check {wall:7.2f} s "
                  f"({n / wall:>9,.0f} spans/s, {wall / base:.1f}x the floor), peak RSS {peak:,.0f} MiB")
            print(f"    {said.split(': ', 1)[-1]}")
            data.unlink()


if __name__ == "__main__":
    main()
