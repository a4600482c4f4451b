"""Redis CPU of a judge call's budget (issue 73): the window's running sums against the window summed
at every admission (evalq before: an HGETALL of every bucket of each axis and a sort), in the same run,
on the same private redis-server, with the same window.

A busy deployment's minute holds up to 600 buckets (0.1 s each) per axis. Each run fills a fresh
deployment's window with ``--buckets`` of them, then makes ``--calls`` admissions, each settled as a
judge call is (its reply back, counted as the provider counted it), from one process: Redis's CPU
(user + system of the server) per call, and the server's own time inside the scripts (INFO
commandstats), calls per second beside.

    .venv/bin/python bench/bench_budget_window.py [--calls 20000] [--buckets 600]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
import redis  # noqa: E402

from evalq.cli.embedded import EmbeddedRedis  # noqa: E402
from evalq.shared.cluster import keys  # noqa: E402
from evalq.workers.judge.budget import BUCKET, MARGIN, Budget  # noqa: E402

# evalq's reserve and settle before the running sums (ee73a66), the baseline: every bucket read per call
SCAN_RESERVE = """
local tok_key, req_key, pause_key, pace_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local tokens, tpm, rpm, window = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local bucket, burst, margin = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[5])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local sec = math.floor(now / bucket)
if tokens > tpm then return {-1, '0', 0, 0, sec} end
local paused = tonumber(redis.call('GET', pause_key) or '0')
if paused > now then return {0, tostring(paused - now), -1, 0, sec} end
local function expiry(s) return (s + 1) * bucket + window + margin end
local function usage(key)
  local flat = redis.call('HGETALL', key)
  local used, buckets = 0, {}
  for i = 1, #flat, 2 do
    local s, v = tonumber(flat[i]), tonumber(flat[i + 1])
    if expiry(s) <= now then redis.call('HDEL', key, flat[i]) else
      used = used + v
      buckets[#buckets + 1] = {s, v}
    end
  end
  table.sort(buckets, function(a, b) return a[1] < b[1] end)
  return used, buckets
end
local used_tok = usage(tok_key)
local used_req = usage(req_key)
local tat = math.max(tonumber(redis.call('GET', pace_key) or '0'), now)
if tat - burst - now <= 0 and used_tok + tokens <= tpm and used_req + 1 <= rpm then
  if redis.call('HINCRBY', tok_key, sec, tokens) == tokens then redis.call('EXPIRE', tok_key, window * 2 + 2) end
  if redis.call('HINCRBY', req_key, sec, 1) == 1 then redis.call('EXPIRE', req_key, window * 2 + 2) end
  local cost = math.max(tokens * window / tpm, window / rpm)
  redis.call('SET', pace_key, tostring(tat + cost), 'EX', math.ceil(window * 2 + burst + cost))
  return {1, '0', used_tok + tokens, used_req + 1, sec}
end
return {0, '0.01', used_tok, used_req, sec}
"""
SCAN_SETTLE = """
local tok_key, req_key = KEYS[1], KEYS[2]
local old, tokens, window, bucket = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local delta = tonumber(ARGV[5] or '0')
local t = redis.call('TIME')
local sec = math.max(math.floor((tonumber(t[1]) + tonumber(t[2]) / 1e6) / bucket), old)
local function move(key, amount, change)
  if sec > old then
    local have = tonumber(redis.call('HGET', key, old) or '0')
    if have > amount then redis.call('HINCRBY', key, old, -amount) elseif have > 0 then redis.call('HDEL', key, old) end
    if redis.call('HINCRBY', key, sec, amount) == amount then redis.call('EXPIRE', key, window * 2 + 2) end
  end
  if change ~= 0 then
    local now = tonumber(redis.call('HGET', key, sec) or '0')
    if now + change > 0 then redis.call('HINCRBY', key, sec, change) else redis.call('HDEL', key, sec) end
  end
end
move(tok_key, tokens, delta)
move(req_key, 1, 0)
return 1
"""


def fill(r: redis.Redis, dep: str, buckets: int, window: int) -> None:
    """A busy minute: ``buckets`` buckets in each axis, the newest a bucket ago."""
    sec, usec = r.time()
    now = int((sec + usec / 1e6) / BUCKET)
    oldest = max(now - buckets, now - int(window / BUCKET) + 2)
    r.hset(keys.budget(dep, "tok"), mapping={str(s): 50 for s in range(oldest, now)})
    r.hset(keys.budget(dep, "req"), mapping={str(s): 1 for s in range(oldest, now)})


def run(r: redis.Redis, server: psutil.Process, calls: int, buckets: int, scan: bool) -> dict:
    dep, window = uuid.uuid4().hex, 60
    fill(r, dep, buckets, window)
    budget = Budget(r, dep, tpm=10**9, rpm=10**8, window=window, burst=window)
    reserve, settle = (r.register_script(SCAN_RESERVE), r.register_script(SCAN_SETTLE)) if scan else (None, None)
    r.config_resetstat()
    cpu0, t0 = sum(server.cpu_times()[:2]), time.perf_counter()
    tok, req, pause, pace = (keys.budget(dep, part) for part in ("tok", "req", "pause", "pace"))
    for _ in range(calls):
        if scan:
            admitted, _, _, _, bucket = reserve(keys=[tok, req, pause, pace],
                                                args=[300, 10**9, 10**8, window, MARGIN, BUCKET, window])
            settle(keys=[tok, req], args=[bucket, 300, window, BUCKET, 20])
        else:
            booked = budget.reserve(300)
            admitted = booked.admitted
            budget.settle(booked, 320)
        assert admitted
    wall, cpu = time.perf_counter() - t0, sum(server.cpu_times()[:2]) - cpu0
    stats = r.info("commandstats")
    inside = sum(v["usec"] for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))
    return {"redis_ms": 1000 * cpu / calls, "inside_us": inside / calls, "per_s": calls / wall,
            "held": r.hlen(tok)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=20_000)
    ap.add_argument("--buckets", type=int, default=600)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        server = EmbeddedRedis(Path(work))
        server.start()
        try:
            r = redis.Redis.from_url(server.url)
            proc = psutil.Process(server.proc.pid)
            rows = [("window summed per call (before)", run(r, proc, args.calls, args.buckets, True)),
                    ("running sums (issue 73)", run(r, proc, args.calls, args.buckets, False))]
        finally:
            server.stop()
    print(f"{args.calls:,} admissions, each settled, one process; {args.buckets} buckets per axis in the window")
    print(f"{'':34} {'Redis CPU ms/call':>18} {'in scripts us/call':>19} {'calls/s':>9}")
    for label, row in rows:
        print(f"{label:34} {row['redis_ms']:>18.3f} {row['inside_us']:>19.1f} {row['per_s']:>9,.0f}")
    before, after = rows[0][1], rows[1][1]
    print(f"Redis CPU per call: {before['redis_ms'] / after['redis_ms']:.1f}x less; inside the scripts "
          f"{before['inside_us'] / after['inside_us']:.1f}x less")


if __name__ == "__main__":
    main()
