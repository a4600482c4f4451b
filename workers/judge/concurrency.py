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
  peak, latency bounded, and the knee found again when the server changes. Latencies are
  compared within their *class* (the tenant, and the ``max_tokens`` its judge asks: what makes a
  call slower by the tenant's own choice): each call's latency over the least round median of its
  class, so that one tenant's long answers never read as the server's queueing for every tenant
  (issue 70);
- a 429, a 503 or a refused connection cuts to 0.8x at once (once per epoch); so does a timeout,
  but only where the call's timeout was more than ``latency_tolerance`` times what calls of its
  class take: a job's timeout set below its calls' own pace is the job's failure, not the
  server's overload, and never moves the limit every tenant shares;
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
    evalq:budget:{D}:adapt           HASH  limit, epoch, phase, n (the round's calls),
                                           peak (most in flight in the round), last (the last
                                           change's reason), probes, hold, held (clean rounds
                                           before the next growth, and since the last change)
    evalq:budget:{D}:adapt:lat       LIST  the round's latencies, each "<class>\t<seconds>"
    evalq:budget:{D}:adapt:base      HASH  class -> the least round median of its calls seen
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import redis

from evalq.shared.cluster import keys, telemetry
from evalq.shared.judging.capacity import HISTORY_KEEP, KEPT_SECONDS, Concurrency

MIN_ROUND = 4

# KEYS: conc, adapt, tenant conc (or conc again), history; ARGV: lease, hold seconds, start, share (0: none).
ACQUIRE_LUA = f"local KEPT = {KEPT_SECONDS}\n" + """
local conc, adapt, mine = KEYS[1], KEYS[2], KEYS[3]
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local limit = tonumber(redis.call('HGET', adapt, 'limit') or '0')
if limit == 0 then
  limit = tonumber(ARGV[3])
  redis.call('HSET', adapt, 'limit', limit, 'epoch', 0, 'phase', 'start', 'n', 0, 'peak', 0)
  redis.call('EXPIRE', adapt, KEPT)
  redis.call('RPUSH', KEYS[4], cjson.encode({t = now, concurrency = limit, reason = 'start'}))
  redis.call('EXPIRE', KEYS[4], KEPT)
end
redis.call('ZREMRANGEBYSCORE', conc, '-inf', now)
local n = redis.call('ZCARD', conc)
if n >= limit then return {0, n, limit, 0} end
local share = tonumber(ARGV[4])
if share > 0 then
  redis.call('ZREMRANGEBYSCORE', mine, '-inf', now)
  if redis.call('ZCARD', mine) >= math.max(1, math.floor(limit * share)) then return {0, n, limit, 0, 1} end
  redis.call('ZADD', mine, now + tonumber(ARGV[2]), ARGV[1])
  redis.call('EXPIRE', mine, math.ceil(tonumber(ARGV[2])) + 60)
end
redis.call('ZADD', conc, now + tonumber(ARGV[2]), ARGV[1])
redis.call('EXPIRE', conc, math.ceil(tonumber(ARGV[2])) + 60)
if n + 1 > tonumber(redis.call('HGET', adapt, 'peak') or '0') then redis.call('HSET', adapt, 'peak', n + 1) end
return {1, n + 1, limit, tonumber(redis.call('HGET', adapt, 'epoch') or '0')}
"""

# KEYS: conc, adapt, lat, hist, tenant conc, base; ARGV: lease, epoch, latency, outcome (ok/overload/
# timeout/none), min, max, tolerance, keep, class, the call's timeout. Returns {limit, changed (0/1)}.
# A round's latencies are judged against the least of their own class (``class``: the tenant and the
# settings it chose that make a call slower, its max_tokens), never against another tenant's calls.
RELEASE_LUA = f"local KEPT = {KEPT_SECONDS}\n" + """
local conc, adapt, lat, hist, mine, base = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
redis.call('ZREM', conc, ARGV[1])
redis.call('ZREM', mine, ARGV[1])
local outcome, class = ARGV[4], ARGV[9]
local limit = tonumber(redis.call('HGET', adapt, 'limit') or '0')
if outcome == 'none' or limit == 0 then return {limit, 0} end
if tonumber(ARGV[2]) ~= tonumber(redis.call('HGET', adapt, 'epoch') or '0') then return {limit, 0} end
local lo, hi, tolerance = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
if outcome == 'timeout' then
  -- a timeout says the server is overloaded only when the call had time to spare by the server's own
  -- pace for calls of its kind: a job's timeout below what its calls take is the job's, not the server's
  local least = tonumber(redis.call('HGET', base, class) or '0')
  if least == 0 or tonumber(ARGV[10]) <= tolerance * least then return {limit, 0} end
  outcome = 'overload'
end
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
  redis.call('EXPIRE', hist, KEPT)
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
redis.call('RPUSH', lat, class .. '\t' .. ARGV[3])
redis.call('EXPIRE', lat, KEPT)
local n = redis.call('HINCRBY', adapt, 'n', 1)
if n < math.max(limit, 4) then return {limit, 0} end
-- each class's median this round, and the least of its round medians seen (its base)
local by = {}
for _, v in ipairs(redis.call('LRANGE', lat, 0, -1)) do
  local c, x = string.match(v, '^(.*)\t(.*)$')
  by[c] = by[c] or {}
  table.insert(by[c], tonumber(x))
end
local ratios, medians = {}, {}
for c, xs in pairs(by) do
  table.sort(xs)
  local m = xs[math.floor((#xs + 1) / 2)]
  medians[c] = m
  local least = tonumber(redis.call('HGET', base, c) or '0')
  if least == 0 or m < least then
    least = m
    redis.call('HSET', base, c, tostring(least))
  end
  for _, x in ipairs(xs) do table.insert(ratios, x / math.max(least, 1e-6)) end
end
redis.call('EXPIRE', base, KEPT)
table.sort(ratios)
local median = ratios[math.floor((#ratios + 1) / 2)]
if median > tolerance then
  if limit <= lo then  -- the server is slower on every call now: new leasts, not a stuck limit
    for c, m in pairs(medians) do redis.call('HSET', base, c, tostring(m)) end
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
                 hold_seconds: float, tenant: str | None = None, share: float | None = None,
                 max_tokens: int = 0, timeout: float = 0.0):
        self.r, self.dep_id, self.region = r, dep_id, region
        # the calls this gate's latencies are compared with: the same tenant's, asking as many tokens
        self.klass, self.timeout = f"{tenant or ''}|{int(max_tokens)}", float(timeout)
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
        return self.acquire_or_why()[0]

    def acquire_or_why(self) -> tuple[Lease | None, bool]:
        """(a place in flight or None, whether a refusal was the tenant's share's rather than the limit's)."""
        name = secrets.token_hex(8)
        admitted, _, limit, epoch, *mine = self._acquire(
            keys=[*self.keys, self.mine, keys.budget(self.dep_id, "limits")],
            args=[name, self.hold, self.bounds.start, self.share or 0])
        telemetry.concurrency_limit(self.region, int(limit))
        if admitted == 1:
            return Lease(name, int(epoch)), False
        return None, bool(mine and mine[0])

    def release(self, lease: Lease, latency: float, outcome: str) -> None:
        """The call is back: ``outcome`` ok (``latency`` seconds), overload (429, 503, no connection:
        the server's own words), timeout (overload only where the call's ``timeout`` was well above
        what calls of its class take) or none (not sent, or an answer that says nothing of load)."""
        b = self.bounds
        limit, _ = self._release(
            keys=[*self.keys, keys.budget(self.dep_id, "adapt:lat"), keys.budget(self.dep_id, "limits"), self.mine,
                  keys.budget(self.dep_id, "adapt:base")],
            args=[lease.name, lease.epoch, f"{latency:.6f}", outcome, b.min, b.max, b.latency_tolerance, HISTORY_KEEP,
                  self.klass, self.timeout])
        telemetry.concurrency_limit(self.region, int(limit))


def gates_of(r: redis.Redis, judge, deployments: list, tenant: str | None) -> dict[str, Gate]:
    """The concurrency gate of each adaptive deployment of ``judge``, as ``tenant`` sees it (its
    ``max_share`` of the limit)."""
    from evalq.shared.cluster.scheduling import Tenants
    from evalq.shared.judging.judges import deployment_id

    share = Tenants.from_env().max_share.get(tenant) if tenant is not None else None
    hold = judge.timeout * 1.5 + 5  # a lease outlives its call's timeout, never a dead worker by long
    return {d.region: Gate(r, deployment_id(judge, d), d.concurrency, d.region, hold, tenant, share,
                           getattr(judge, "max_tokens", 0) or 0, judge.timeout)
            for d in deployments if d.capacity == "adaptive"}


def load_said(exc: BaseException) -> str:
    """What a failed call says of the server's load: ``overload`` (429, 503, no connection),
    ``timeout`` (overload only where the call's timeout left it time to spare: ``Gate.release``) or
    ``none``."""
    import openai

    from evalq.shared.core.errors import Deferred
    from evalq.workers.judge.requests import RateLimited

    if isinstance(exc, openai.APITimeoutError):
        return "timeout"
    if isinstance(exc, (RateLimited, Deferred, openai.RateLimitError, openai.APIConnectionError)):
        return "overload"
    if isinstance(exc, openai.APIStatusError) and exc.status_code == 503:
        return "overload"
    return "none"
