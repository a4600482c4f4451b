"""A deployment's learned TPM and RPM (``"tpm": "auto"``, ``"rpm": "auto"``; issue 62), one value
for the whole cluster in Redis, told by every worker's replies.

Per limit (tokens, requests), what decides it, first that applies:

1. the provider states it (``x-ratelimit-limit-*``; ``evalq.shared.judging.capacity.rate_headers``):
   that number, or less where its remaining count says others use part of it (``used + remaining``,
   smoothed: ``used`` is what the cluster holds in its window now);
2. it states only what remains (Azure OpenAI): ``used + remaining``, smoothed;
3. nothing is stated: AIMD on evidence (issue 77). The provider's sliding window lets a burst through
   until it fills, so a limit grown while nothing refuses may be far past what the provider serves
   (x1.5 a sixth-window took a 60,000 TPM deployment to 170,861 before its first 429). So growth is
   bounded by what the cluster has had admitted in its last window (``E``, the tokens or requests in
   its window, in the provider's units once each reply settled): until the first 429 the limit
   grows, each sixth of a window while the budget holds calls back, up to twice ``E`` (slow start:
   the provider has served ``E``, the limit guesses at most as much again, x1.5 a step at most);
   after it, +5% a step, and only while ``E`` is within 10% of the limit (a limit nobody uses proves
   nothing). A 429 (its first of an episode; one episode is one cut, at most once a quarter window)
   cuts the limit to what was admitted before it, 0.95 ``E`` without the refused call (never below
   half the limit, nor the floor): the measure of what the provider served, not a fixed factor of a
   limit that may never have been reached. While a deployment learns, a 429 never ends an item: its
   chunk waits for the budget (``Deferred``), and the client's retries are not spent on it. The
   Retry-After of a 429 pauses the deployment as ever, but never sets how long the limit stays cut.

Every value is held between the floor (only for what AIMD decides: a provider's number is taken
even below it) and the ceiling (always). Changes go into the deployment's history
(``evalq.results.limits.history``), which run.json shows per job.

Keys (``D``: the deployment id):

    evalq:budget:{D}:learn    HASH  tpm, rpm (learned, per window), <axis>_how (header/remaining/aimd),
                                    <axis>_said (server time a header last said it), <axis>_cut, <axis>_grow,
                                    <axis>_phase (start: x1.5 growth, until the first cut)
    evalq:budget:{D}:limits   LIST  JSON changes {t, tpm|rpm|concurrency, reason}, the last 500
"""

from __future__ import annotations

import threading
import time

import redis

from evalq.shared.cluster import keys, telemetry
from evalq.shared.judging.capacity import AUTO, HISTORY_KEEP, KEPT_SECONDS, rate_headers
from evalq.workers.judge.budget_lua import WINDOW_LUA

CACHE_SECONDS = 0.5   # how long a process uses the learned values it read
PRESSED_EVERY = 1.0   # a process tells the learner its budget held calls back at most this often
CUT = 0.95           # a cut: to this share of what was admitted before the 429 ...
CUT_MOST = 0.5       # ... never below this share of the limit it cuts,
CUT_REACHED = 0.8    # ... and at most this share of a limit that was used to 90% and still refused
GROW_START, GROW = 1.5, 1.05
SMOOTH = 0.5          # weight of a new remaining-based estimate

# KEYS: learn, limits, usage (tok or req), the window's running sums; ARGV: axis, op, value, floor, ceiling, start, window, keep, bucket,
# then two of the op's (limit: the remaining count or '', and the smoothing; remaining: '', the smoothing;
# cut: the share of what was served, the least share of the limit; grow: the factors before and after the
# first cut), then a reply's counted/reserved ratio or '', then (cut) the most share of a limit reached or '',
# then the budget's travel margin (seconds).
# op: limit (value: the stated limit), remaining, cut (value: the refused call's own tokens or request), grow.
LEARN_LUA = WINDOW_LUA + f"local KEPT = {KEPT_SECONDS}\n" + """
local learn, hist, usage, win = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local margin = tonumber(ARGV[14])
local axis, op, value = ARGV[1], ARGV[2], tonumber(ARGV[3])
local floor, ceiling, start, window = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local keep, bucket = tonumber(ARGV[8]), tonumber(ARGV[9])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local current = tonumber(redis.call('HGET', learn, axis) or start)
local function field(name) return tonumber(redis.call('HGET', learn, axis .. '_' .. name) or '0') end
-- what the provider counted of what the cluster reserved (its prompt count and max_tokens against
-- the reservation's), smoothed: the cluster's window is in reserved tokens, the provider's remaining
-- count in its own
local ratio = tonumber(redis.call('HGET', learn, axis .. '_ratio') or '1')
if ARGV[12] ~= nil and ARGV[12] ~= '' then
  ratio = 0.8 * ratio + 0.2 * tonumber(ARGV[12])
  redis.call('HSET', learn, axis .. '_ratio', tostring(ratio))
end
-- what the cluster holds in the provider's window now: the budget's running sum of the usage hash
-- (``live``, the window and the travel margin; kept up as the budget's own scripts keep it), less the
-- buckets that left the provider's window and are only within the margin (a few HGETs, not the hash)
local function used()
  local short = axis == 'tpm' and 'tok' or 'req'
  local sum, from = live(usage, win, short, now, bucket, window, margin)
  redis.call('HSET', win, short .. '_sum', sum, short .. '_from', from)
  local s = from
  while (s + 1) * bucket + window <= now do
    local v = redis.call('HGET', usage, s)
    if v then sum = sum - tonumber(v) end
    s = s + 1
  end
  return sum * ratio
end
local new, how = nil, nil
if op == 'limit' or op == 'remaining' then
  local remaining = value
  if op == 'limit' then remaining = tonumber(ARGV[10]) end  -- nil where the reply said no remaining count
  local estimate = nil
  if remaining ~= nil then
    estimate = used() + remaining
    if redis.call('HGET', learn, axis .. '_how') == 'remaining' or op == 'limit' then
      estimate = (1 - tonumber(ARGV[11])) * current + tonumber(ARGV[11]) * estimate
    end
  end
  if op == 'limit' then
    new = value
    if estimate ~= nil and estimate < value then new = estimate end
    how = (estimate ~= nil and estimate < value) and 'remaining' or 'header'
  else
    new, how = estimate, 'remaining'
  end
  redis.call('HSET', learn, axis .. '_said', tostring(now))
elseif now - field('said') < window then
  return {tostring(current), 0}  -- a header spoke within the window: AIMD keeps out of it
elseif op == 'cut' then
  redis.call('HSET', learn, axis .. '_429', tostring(now))  -- every 429, also those within one episode
  if now - field('cut') < window / 4 then return {tostring(current), 0} end
  -- what the provider served before refusing: the cluster's window without the refused call (value)
  local served = math.max(0, used() - value)
  local measure = math.min(current * tonumber(ARGV[10]), served * tonumber(ARGV[10]))
  -- a limit that was reached (what was served is within 10% of it) and still refused is too high
  -- whatever was served: then a fixed factor too (the provider's quota cut, others using it)
  if served >= 0.9 * current then measure = math.min(measure, current * tonumber(ARGV[13])) end
  new, how = math.max(floor, math.floor(math.max(current * tonumber(ARGV[11]), measure))), 'aimd'
  redis.call('HSET', learn, axis .. '_cut', tostring(now), axis .. '_phase', 'avoid')
elseif op == 'grow' then
  -- no growth within a window of any 429: a refused call is held in the cluster's window as a sent
  -- one, so the budget looks full (and asks to grow) exactly while the provider refuses
  if now - field('grow') < window / 6 or now - field('429') < window then return {tostring(current), 0} end
  local served = used()  -- what the provider has taken in the cluster's window: the evidence
  if redis.call('HGET', learn, axis .. '_phase') == 'avoid' then
    if served < 0.9 * current then return {tostring(current), 0} end  -- a limit nobody uses proves nothing
    new = math.ceil(current * tonumber(ARGV[11]))
  else
    new = math.min(math.ceil(current * tonumber(ARGV[10])), math.floor(2 * served))
    if new <= current then return {tostring(current), 0} end
  end
  new, how = math.max(floor, new), 'aimd'
  redis.call('HSET', learn, axis .. '_grow', tostring(now))
end
new = math.floor(math.min(new, ceiling))
if new < 1 then new = 1 end
redis.call('HSET', learn, axis .. '_how', how)
redis.call('EXPIRE', learn, KEPT)
local before = redis.call('HGET', learn, axis)
if before ~= false and math.abs(new - tonumber(before)) <= math.max(1, 0.005 * tonumber(before)) then
  return {before, 0}
end
redis.call('HSET', learn, axis, new)
redis.call('RPUSH', hist, cjson.encode({t = now, [axis] = new, reason = how .. (op == 'cut' and ' 429' or '')}))
redis.call('LTRIM', hist, -keep, -1)
redis.call('EXPIRE', hist, KEPT)
return {tostring(new), 1}
"""


class Learner:
    """The learned TPM/RPM of one deployment ``d`` (a ``Deployment`` with ``auto`` limits)."""

    _scripts: dict[int, object] = {}

    def __init__(self, r: redis.Redis, dep_id: str, d, region: str, bucket: float, margin: float = 0.25):
        self.r, self.dep_id, self.region, self.window, self.bucket = r, dep_id, region, d.window_seconds, bucket
        self.margin = margin  # the budget's: its running sums cover the window and this
        self.axes = {axis: (getattr(d, f"{axis}_floor") or getattr(d, f"{axis}_start"), getattr(d, f"{axis}_most"),
                            getattr(d, f"{axis}_start"))
                     for axis in ("tpm", "rpm") if getattr(d, axis) == AUTO}
        self.fixed = {"tpm": d.tpm_start, "rpm": d.rpm_start}
        self.stated = {"tpm": isinstance(d.tpm, int), "rpm": isinstance(d.rpm, int)}  # (None: no limit, no gauge)
        self._lock = threading.Lock()
        self._read_at, self._values = 0.0, dict(self.fixed)
        self._pressed_at = 0.0
        if id(r) not in self._scripts:
            self._scripts[id(r)] = r.register_script(LEARN_LUA)
        self._learn = self._scripts[id(r)]

    def limits(self) -> tuple[int, int]:
        """(tpm, rpm) in force now: learned (read at most every ``CACHE_SECONDS``) or stated."""
        now = time.monotonic()
        if now - self._read_at > CACHE_SECONDS:
            raw = self.r.hmget(keys.budget(self.dep_id, "learn"), ["tpm", "rpm"])
            values = dict(self.fixed)
            for axis, value in zip(("tpm", "rpm"), raw):
                if axis in self.axes and value is not None:
                    values[axis] = int(float(value))
            with self._lock:
                self._read_at, self._values = now, values
            telemetry.deployment_limits([(self.region, *(values[a] if a in self.axes or self.stated[a] else None
                                                        for a in ("tpm", "rpm")))])
        return self._values["tpm"], self._values["rpm"]

    def _op(self, axis: str, op: str, value: float = 0.0, *extra) -> None:
        floor, ceiling, start = self.axes[axis]
        usage = keys.budget(self.dep_id, "tok" if axis == "tpm" else "req")
        extra = (*extra, "", "", "", "")[:4]  # ARGV 10-13: the op's; 14: the margin
        _, changed = self._learn(keys=[keys.budget(self.dep_id, "learn"), keys.budget(self.dep_id, "limits"), usage,
                                       keys.budget(self.dep_id, "win")],
                                 args=[axis, op, value, floor, ceiling, start, self.window, HISTORY_KEEP, self.bucket,
                                       *extra, self.margin])
        if changed:
            self._read_at = 0.0  # read it again at the next call

    def observe(self, headers, rate_limited: bool = False, counted: float | None = None, refused: int = 0) -> None:
        """What a reply (or a 429) said: stated limits and remaining counts taken; a 429 that
        said nothing of a limit cuts it (AIMD) to what was admitted before it (``refused``: the
        tokens the refused call itself holds in the window). ``counted``: the share of its
        reservation the provider counted (its prompt tokens and ``max_tokens`` over what was reserved)."""
        if not self.axes:
            return
        said = rate_headers(headers or {}, self.window)
        for axis, kind in (("tpm", "tokens"), ("rpm", "requests")):
            if axis not in self.axes:
                continue
            sample = "" if counted is None or axis != "tpm" else f"{counted:.6f}"
            limit, remaining = said.get(f"{kind}_limit"), said.get(f"{kind}_remaining")
            if limit is not None:
                self._op(axis, "limit", limit, "" if remaining is None else remaining, SMOOTH, sample)
            elif remaining is not None:
                self._op(axis, "remaining", remaining, "", SMOOTH, sample)
            elif rate_limited:
                self._op(axis, "cut", refused if axis == "tpm" else 1, CUT, CUT_MOST, "", CUT_REACHED)

    def pressed(self) -> None:
        """The budget held a call back (not a 429's pause): where AIMD decides, room to grow."""
        now = time.monotonic()
        if not self.axes or now - self._pressed_at < PRESSED_EVERY:
            return
        self._pressed_at = now
        for axis in self.axes:
            self._op(axis, "grow", 0, GROW_START, GROW)

