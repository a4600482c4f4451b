"""One judge call's CPU on the HTTP side alone (issue 73): the same chat request to judge-sim (no
latency, its own process) through the openai SDK's ``chat.completions.create``, its ``client.post``
(what evalq sent through before), evalq's ``post_chat`` (the request the SDK built once, sent through
the SDK client's pool: ``evalq.workers.judge.transport``), and the SDK's asynchronous client's pool
from one event loop with the same prebuilt request; from 1, 8 and 64 threads (or calls in flight).
CPU seconds of this process per call (user + system), in the same run.

    .venv/bin/python bench/bench_judge_transport.py [--calls 1500]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import openai  # noqa: E402

from bench_judge_path import KEY_ENV, start_sim  # noqa: E402
from evalq.workers.judge.transport import POST_OPTIONS, post_chat  # noqa: E402

BODY = {"model": "judge-sim", "temperature": 0, "max_tokens": 100,
        "messages": [{"role": "system", "content": "Rate the coherence of the answer from 1 to 5. " * 10},
                     {"role": "user", "content": "Question: what grew? Answer: revenue, in the third quarter. " * 3}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "rating", "strict": True, "schema": {
            "type": "object", "properties": {"score": {"type": "integer"}, "reasoning": {"type": "string"}},
            "required": ["score", "reasoning"], "additionalProperties": False}}}}


def threaded(fn, calls: int, threads: int) -> float:
    for _ in range(50):
        fn()
    cpu = time.process_time()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda _: fn(), range(calls)))
    return (time.process_time() - cpu) / calls * 1000


async def in_flight(fn, calls: int, width: int) -> float:
    for _ in range(50):
        await fn()
    cpu, room = time.process_time(), asyncio.Semaphore(width)

    async def one() -> None:
        async with room:
            await fn()

    await asyncio.gather(*(one() for _ in range(calls)))
    return (time.process_time() - cpu) / calls * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1500)
    args = parser.parse_args()
    sim, url = start_sim(0.0, 512)
    try:
        client = openai.OpenAI(base_url=url, api_key="bench", max_retries=0, timeout=30)
        sync = {"chat.completions.create": lambda: client.chat.completions.create(**BODY),
                "client.post": lambda: json.loads(client.post("/chat/completions", body=BODY, cast_to=object,
                                                              options=POST_OPTIONS).http_response.content),
                "evalq post_chat": lambda: post_chat(client, BODY)}
        rows = {name: [threaded(fn, args.calls, k) for k in (1, 8, 64)] for name, fn in sync.items()}
        aclient = openai.AsyncOpenAI(base_url=url, api_key="bench", max_retries=0, timeout=30)
        pool = aclient._client  # the asynchronous client's own pool, sent the request built once
        headers = {k: v for k, v in {**aclient.default_headers, **aclient.auth_headers,
                                     "Content-Type": "application/json"}.items() if isinstance(v, str)}
        target = str(aclient.base_url).rstrip("/") + "/chat/completions"

        async def asynchronous():
            reply = await pool.post(target, content=json.dumps(BODY, separators=(",", ":")).encode(), headers=headers)
            return json.loads(reply.content)

        async def each() -> list[float]:  # (one event loop: the pool's connections belong to it)
            return [await in_flight(asynchronous, args.calls, k) for k in (1, 8, 64)]

        rows["async pool, prebuilt request"] = asyncio.run(each())
    finally:
        sim.terminate()
        sim.wait(10)
    print(f"judge call, HTTP side only: CPU ms a call (this process), {args.calls} calls each, {os.cpu_count()} CPUs")
    print(f"{'path':32} | {'1 thread':>8} | {'8':>8} | {'64':>8}")
    for name, (one, eight, many) in rows.items():
        print(f"{name:32} | {one:8.2f} | {eight:8.2f} | {many:8.2f}")


if __name__ == "__main__":
    os.environ.setdefault(KEY_ENV, "bench")
    main()
