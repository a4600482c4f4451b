"""Adaptive concurrency (``"capacity": "adaptive"``; issue 62): one limit of calls in flight to a
deployment for the whole cluster, held in Redis, and learned from how the server answers.

Why this controller: a self-hosted server (vLLM, TGI, llama.cpp) has no quota, only a curve of
latency against concurrency. Below its knee, more calls in flight give more throughput at about
the same latency; past it, calls wait in the server's queue: throughput stays flat and latency
grows in proportion (Little's law). Latency is therefore the signal that needs no knowledge of
the server, and errors are the late one. The limit moves as AIMD does, on latency as well as on
refusals (a gradient in the sense of Netflix's concurrency-limits: the round's latency against
the least seen):

- calls are measured in rounds (as many calls as the limit, at least 4), each begun after the
  last change (an "epoch": calls admitted before a change do not judge it);
- a round whose median latency is above ``latency_tolerance`` (2 by default) times the least
  round median seen means calls queue in the server: the limit is cut to 0.8x. With 2, the
  limit settles where about half of what is in flight waits at the server: throughput at its
  peak, latency bounded, and the knee found again when the server changes;
- a 429, a 503, a timeout or a refused connection cuts to 0.8x at once (once per epoch);
- a round within tolerance in which the limit was reached (so it was what held calls back)
  grows it: doubled while no cut has come yet (slow start); after a cut, +10% (at least 1) once 4
  such rounds in a row have passed, and after a growth that was cut again at once (a probe past the
  knee that failed) twice as many (8, 16, ... up to 64): on llama-cpp-python's server, which is 4x
  slower at 2 calls in flight than at 1, probing every round spent most of the time at 2;
- never outside ``min``..``max``; a tenant with ``max_share`` gets that share of it (at least 1).
  At ``min``, a server that is slower on every call (longer answers) sets a new least latency,
  rather than holding the limit down for good.

A lease is a call in flight: it lapses after the call's timeout (a worker that died holds nothing
for long). Keys (``D``: the deployment id):

    evalq:budget:{D}:conc            ZSET  lease -> server time it lapses
    evalq:budget:{D}:tenant-<t>:conc ZSET  the same, for a tenant with a share
    evalq:budget:{D}:adapt           HASH  limit, epoch, phase, rtt_min, n (the round's calls),
                                           peak (most in flight in the round), last (the last
                                           change's reason), probes, hold, held (clean rounds
                                           before the next growth, and since the last change)
    evalq:budget:{D}:adapt:lat       LIST  the round's latencies
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import redis

from evalq.shared.cluster import keys, telemetry
from evalq.shared.judging.capacity import HISTORY_KEEP, Concurrency

MIN_ROUND = 4
KEEP_DAYS = 30 * 86400

# KEYS: conc, adapt, tenant conc (or conc again), history; ARGV: lease, hold seconds, start, share (0: none).
ACQUIRE_LUA = """
local conc, adapt, mine = KEYS[1], KEYS[2], KEYS[3]
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local limit = tonumber(redis.call('HGET', adapt, 'limit') or '0')
if limit == 0 then
  limit = tonumber(ARGV[3])
  redis.call('HSET', adapt, 'limit', limit, 'epoch', 0, 'phase', 'start', 'n', 0, 'peak', 0)
  redis.call('EXPIRE', adapt, 2592000)
  redis.call('RPUSH', KEYS[4], cjson.encode({t = now, concurrency = limit, reason = 'start'}))
  redis.call('EXPIRE', KEYS[4], 2592000)
end
redis.call('ZREMRANGEBYSCORE', conc, '-inf', now)
local n = redis.call('ZCARD', conc)
if n >= limit then return {0, n, limit, 0} end
local share = tonumber(ARGV[4])
if share > 0 then
  redis.call('ZREMRANGEBYSCORE', mine, '-inf', now)
  if redis.call('ZCARD', mine) >= math.max(1, math.floor(limit * share)) then return {0, n, limit, 0} end
  redis.call('ZADD', mine, now + tonumber(ARGV[2]), ARGV[1])
  redis.call('EXPIRE', mine, math.ceil(tonumber(ARGV[2])) + 60)
end
redis.call('ZADD', conc, now + tonumber(ARGV[2]), ARGV[1])
redis.call('EXPIRE', conc, math.ceil(tonumber(ARGV[2])) + 60)
if n + 1 > tonumber(redis.call('HGET', adapt, 'peak') or '0') then redis.call('HSET', adapt, 'peak', n + 1) end
return {1, n + 1, limit, tonumber(redis.call('HGET', adapt, 'epoch') or '0')}
"""

# KEYS: conc, adapt, lat, hist, tenant conc; ARGV: lease, epoch, latency, outcome (ok/overload/none),
# min, max, tolerance, keep. Returns {limit, changed (0/1)}.
RELEASE_LUA = """
local conc, adapt, lat, hist, mine = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
redis.call('ZREM', conc, ARGV[1])
redis.call('ZREM', mine, ARGV[1])
local outcome = ARGV[4]
local limit = tonumber(redis.call('HGET', adapt, 'limit') or '0')
if outcome == 'none' or limit == 0 then return {limit, 0} end
if tonumber(ARGV[2]) ~= tonumber(redis.call('HGET', adapt, 'epoch') or '0') then return {limit, 0} end
local lo, hi, tolerance = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local function change(new, reason)
  new = math.max(lo, math.min(hi, new))
  redis.call('DEL', lat)
  redis.call('HSET', adapt, 'n', 0, 'peak', redis.call('ZCARD', conc))
  if new == limit then return {limit, 0} end
  redis.call('HINCRBY', adapt, 'epoch', 1)
  redis.call('HSET', adapt, 'limit', new, 'last', reason)
  redis.call('RPUSH', hist, cjson.encode({t = now, concurrency = new, reason = reason}))
  redis.call('LTRIM', hist, -tonumber(ARGV[8]), -1)
  redis.call('EXPIRE', hist, 2592000)
  return {new, 1}
end
local function cut(reason)
  -- a cut right after a growth is a probe that failed: the next one waits twice as many clean rounds
  local probes = 0
  if redis.call('HGET', adapt, 'last') == 'grow' then probes = tonumber(redis.call('HGET', adapt, 'probes') or '0') + 1 end
  redis.call('HSET', adapt, 'phase', 'avoid', 'probes', probes, 'hold', math.min(64, 4 * 2 ^ probes), 'held', 0)
  return change(math.min(limit - 1, math.floor(limit * 0.8)), reason)
end
if outcome == 'overload' then return cut('refused') end
redis.call('RPUSH', lat, ARGV[3])
redis.call('EXPIRE', lat, 2592000)
local n = redis.call('HINCRBY', adapt, 'n', 1)
if n < math.max(limit, 4) then return {limit, 0} end
local values = redis.call('LRANGE', lat, 0, -1)
local xs = {}
for i, v in ipairs(values) do xs[i] = tonumber(v) end
table.sort(xs)
local median = xs[math.floor((#xs + 1) / 2)]
local least = tonumber(redis.call('HGET', adapt, 'rtt_min') or '0')
if least == 0 or median < least then
  least = median
  redis.call('HSET', adapt, 'rtt_min', tostring(least))
end
if median > tolerance * least then
  if limit <= lo then  -- the server is slower on every call now: a new least, not a stuck limit
    redis.call('HSET', adapt, 'rtt_min', tostring(median))
    return change(limit, 'latency')
  end
  return cut('latency')
end
if tonumber(redis.call('HGET', adapt, 'peak') or '0') >= limit then
  if redis.call('HGET', adapt, 'last') == 'grow' then  -- the last probe held at its limit: the next comes sooner
    redis.call('HSET', adapt, 'last', 'held', 'probes', 0, 'hold', 4)
  end
  if redis.call('HGET', adapt, 'phase') == 'start' then return change(limit * 2, 'grow') end
  if redis.call('HINCRBY', adapt, 'held', 1) < tonumber(redis.call('HGET', adapt, 'hold') or '4') then
    return change(limit, 'steady')
  end
  redis.call('HSET', adapt, 'held', 0)
  return change(limit + math.max(1, math.floor(limit * 0.1)), 'grow')
end
return change(limit, 'steady')
"""


@dataclass(frozen=True)
class Lease:
    name: str
    epoch: int


class Gate:
    """One adaptive deployment's cluster-wide limit of calls in flight (``bounds``: its
    ``Concurrency``), as one tenant (``share`` of it, or None) sees it."""

    _scripts: dict[int, tuple] = {}

    def __init__(self, r: redis.Redis, dep_id: str, bounds: Concurrency | None, region: str,
                 hold_seconds: float, tenant: str | None = None, share: float | None = None):
        self.r, self.dep_id, self.region = r, dep_id, region
        self.bounds = bounds or Concurrency()
        self.hold = float(hold_seconds)
        self.share = share if share is not None and share < 1 else None
        self.keys = [keys.budget(dep_id, "conc"), keys.budget(dep_id, "adapt")]
        self.mine = keys.budget(dep_id, f"tenant-{tenant}:conc") if self.share else self.keys[0]
        if id(r) not in self._scripts:
            self._scripts[id(r)] = (r.register_script(ACQUIRE_LUA), r.register_script(RELEASE_LUA))
        self._acquire, self._release = self._scripts[id(r)]

    def acquire(self) -> Lease | None:
        """A place in flight, or None while the limit is reached."""
        name = secrets.token_hex(8)
        admitted, _, limit, epoch = self._acquire(keys=[*self.keys, self.mine, keys.budget(self.dep_id, "limits")],
                                                  args=[name, self.hold, self.bounds.start, self.share or 0])
        telemetry.concurrency_limit(self.region, int(limit))
        return Lease(name, int(epoch)) if admitted == 1 else None

    def release(self, lease: Lease, latency: float, outcome: str) -> None:
        """The call is back: ``outcome`` ok (``latency`` seconds), overload (429, 503, a timeout, no
        connection) or none (not sent, or an answer that says nothing of load)."""
        b = self.bounds
        limit, _ = self._release(
            keys=[*self.keys, keys.budget(self.dep_id, "adapt:lat"), keys.budget(self.dep_id, "limits"), self.mine],
            args=[lease.name, lease.epoch, f"{latency:.6f}", outcome, b.min, b.max, b.latency_tolerance, HISTORY_KEEP])
        telemetry.concurrency_limit(self.region, int(limit))
