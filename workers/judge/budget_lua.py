"""The Lua scripts of a deployment's budget (``evalq.workers.judge.budget`` says what each key holds):
reserve (check and book a call under the window and the pacing), settle (a reply is back: count it
from now, as the provider counted it), pause (a 429's Retry-After), release (give back a limit's
booking the shared budget refused), and the estimator's bias folded in."""

# The window's running sums (issue 73): an admission read every bucket of the window (an HGETALL of
# up to 600 per axis, and a sort) to sum it, the Redis CPU of a judge call at a self-hosted judge's
# pace. Beside each usage hash, ``win`` keeps <axis>_sum, what its buckets from <axis>_from on hold:
# buckets are dropped from the sum as they leave the window (one HGET each, as time passes, not per
# call), and every script that adds to or takes from a bucket moves the sum with it. The sums are
# summed again from the buckets once a window (<axis>_built), when they are missing or far behind: what
# changed the buckets without them (an older evalq in a rolling upgrade) is forgotten within a window.
WINDOW_LUA = """
local SCAN = 64  -- buckets stepped over one at a time, at most; beyond, the hash is summed again
local function expiry(s, bucket, window, margin) return (s + 1) * bucket + window + margin end
-- what usage hash key (axis: tok or req) holds in its live buckets, dropping those that left the
-- window by now; returns sum, from (the first bucket that may be live)
local function live(key, win, axis, now, bucket, window, margin)
  local got = redis.call('HMGET', win, axis .. '_sum', axis .. '_from', axis .. '_built')
  local sum, from, built = tonumber(got[1]), tonumber(got[2]), tonumber(got[3] or '0')
  local sec = math.floor(now / bucket)
  if sum == nil or from == nil or sec - from > SCAN + (window + margin) / bucket or now - built > window then
    sum, from = 0, sec  -- (no bucket before now's is written from here on: every script books at now's)
    local flat = redis.call('HGETALL', key)
    for i = 1, #flat, 2 do
      local s = tonumber(flat[i])
      if expiry(s, bucket, window, margin) <= now then
        redis.call('HDEL', key, flat[i])
      else
        sum = sum + tonumber(flat[i + 1])
        if s < from then from = s end
      end
    end
    redis.call('HSET', win, axis .. '_built', tostring(now))
    redis.call('EXPIRE', win, math.ceil(window * 2 + 2))
  else
    while from <= sec and expiry(from, bucket, window, margin) <= now do
      local v = redis.call('HGET', key, from)
      if v then
        sum = sum - tonumber(v)
        redis.call('HDEL', key, from)
      end
      from = from + 1
    end
  end
  return sum, from
end
-- adds amount to bucket s of key (opening it sets the keys' expiry) and to the window's sum
local function add(key, win, axis, s, amount, ttl)
  if redis.call('HINCRBY', key, s, amount) == amount then
    redis.call('EXPIRE', key, ttl)
    redis.call('EXPIRE', win, ttl)
  end
  redis.call('HINCRBY', win, axis .. '_sum', amount)
end
-- takes up to amount from bucket s of key (the bucket goes at 0), and from the window's sum where
-- the bucket was still in it (a bucket that left the window was dropped from the sum and the hash)
local function take(key, win, axis, s, amount)
  local have = tonumber(redis.call('HGET', key, s) or '0')
  if have <= 0 then return 0 end
  if have > amount then
    redis.call('HINCRBY', key, s, -amount)
  else
    redis.call('HDEL', key, s)
    amount = have
  end
  redis.call('HINCRBY', win, axis .. '_sum', -amount)
  return amount
end
"""

# Returns {admitted (1/0/-1), wait_seconds (string), used_tokens, used_requests, bucket}.
# -1: the request alone exceeds the deployment's TPM and can never be admitted.
RESERVE_LUA = WINDOW_LUA + """
local tok_key, req_key, pause_key, pace_key, win = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local tokens = tonumber(ARGV[1])
local tpm = tonumber(ARGV[2])
local rpm = tonumber(ARGV[3])
local window = tonumber(ARGV[4])
local bucket = tonumber(ARGV[6])
local burst = tonumber(ARGV[7])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local sec = math.floor(now / bucket)
if tokens > tpm then
  return {-1, '0', 0, 0, sec}
end
local paused = tonumber(redis.call('GET', pause_key) or '0')
if paused > now then
  return {0, tostring(paused - now), -1, 0, sec}
end
-- Bucket s holds reservations made during [s, s + 1) * bucket; the provider's
-- sliding window still counts them until (s + 1) * bucket + window, plus the
-- request's travel time (margin). Dropping a bucket earlier would admit
-- calls the provider then rejects with 429.
local margin = tonumber(ARGV[5])
local used_tok, tok_from = live(tok_key, win, 'tok', now, bucket, window, margin)
local used_req, req_from = live(req_key, win, 'req', now, bucket, window, margin)
redis.call('HSET', win, 'tok_sum', used_tok, 'tok_from', tok_from, 'req_sum', used_req, 'req_from', req_from)
-- Pacing (GCRA): calls are spaced at the TPM/RPM rate. tat is when the calls
-- admitted so far would have been sent at that rate; a call goes when that
-- backlog is at most 'burst' seconds, and pushes tat on by its own cost.
local tat = math.max(tonumber(redis.call('GET', pace_key) or '0'), now)
local pace_wait = tat - burst - now
if pace_wait <= 0 and used_tok + tokens <= tpm and used_req + 1 <= rpm then
  -- a key's expiry is set as a bucket is opened in it (ten times a second at most), not per call
  add(tok_key, win, 'tok', sec, tokens, window * 2 + 2)
  add(req_key, win, 'req', sec, 1, window * 2 + 2)
  local cost = math.max(tokens * window / tpm, window / rpm)
  redis.call('SET', pace_key, tostring(tat + cost), 'EX', math.ceil(window * 2 + burst + cost))
  return {1, '0', used_tok + tokens, used_req + 1, sec}
end
-- When will enough of the window have slid out? (the buckets, in order: only a call held back reads them)
local function wait_for(key, used, need, limit)
  if used + need <= limit then return 0 end
  local flat, buckets = redis.call('HGETALL', key), {}
  for i = 1, #flat, 2 do buckets[#buckets + 1] = {tonumber(flat[i]), tonumber(flat[i + 1])} end
  table.sort(buckets, function(a, b) return a[1] < b[1] end)
  local freed = 0
  for _, b in ipairs(buckets) do
    freed = freed + b[2]
    if used - freed + need <= limit then
      return expiry(b[1], bucket, window, margin) - now
    end
  end
  return window
end
local w = math.max(wait_for(tok_key, used_tok, tokens, tpm), wait_for(req_key, used_req, 1, rpm), pace_wait)
return {0, tostring(math.max(w, 0.01)), used_tok, used_req, sec}
"""

# Moves an admitted call's tokens and request from the bucket it was reserved
# in to the bucket of now (its reply has come back). The provider counts a call
# from when it arrived, which can be later than the reservation (a slow
# connection, a busy worker); counting it from the reply's return, later still,
# means evalq's window never lets a call go before the provider's does. ``delta``:
# what the provider counted beyond (or below) the reservation, in the window and
# in the pacing (KEYS[3], ARGV[6] the TPM): the budget holds what the provider
# counts, not evalq's estimate of it.
SETTLE_LUA = WINDOW_LUA + """
local tok_key, req_key, pace_key, win = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local old = tonumber(ARGV[1])
local tokens = tonumber(ARGV[2])
local window = tonumber(ARGV[3])
local bucket = tonumber(ARGV[4])
local delta = tonumber(ARGV[5] or '0')
local t = redis.call('TIME')
local sec = math.max(math.floor((tonumber(t[1]) + tonumber(t[2]) / 1e6) / bucket), old)
local function move(key, axis, amount, change)
  if sec > old then
    take(key, win, axis, old, amount)
    -- the key's expiry is set where a bucket is opened in it (the reservation's set it for its own)
    add(key, win, axis, sec, amount, window * 2 + 2)
  end
  if change > 0 then  -- what the server counted beyond (or, for a limit holding a worst case, below) it
    add(key, win, axis, sec, change, window * 2 + 2)
  elseif change < 0 then
    take(key, win, axis, sec, -change)
  end
end
move(tok_key, 'tok', tokens, delta)
move(req_key, 'req', 1, 0)
if delta ~= 0 and pace_key and ARGV[6] then
  local tat = tonumber(redis.call('GET', pace_key) or '0')
  if tat > 0 then redis.call('SET', pace_key, tostring(tat + delta * window / tonumber(ARGV[6])), 'KEEPTTL') end
end
return 1
"""

PAUSE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local until_ts = now + tonumber(ARGV[1])
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if until_ts > current then
  redis.call('SET', KEYS[1], tostring(until_ts), 'EX', math.ceil(tonumber(ARGV[1])) + 1)
end
return tostring(until_ts)
"""


RELEASE_LUA = WINDOW_LUA + """
local tok_key, req_key, win = KEYS[1], KEYS[2], KEYS[3]
local bucket, tokens = tonumber(ARGV[1]), tonumber(ARGV[2])
take(tok_key, win, 'tok', bucket, tokens)
take(req_key, win, 'req', bucket, 1)
return 1
"""


# ``Budget.observe`` of each (estimated, server) pair of ARGV[2:] in turn; ARGV[1] the decay
FOLD_LUA = """
local flat = redis.call('HMGET', KEYS[1], 'server', 'estimate')
local server, estimate = tonumber(flat[1] or '0'), tonumber(flat[2] or '0')
local decay = tonumber(ARGV[1])
for i = 2, #ARGV, 2 do
  estimate = estimate * decay + tonumber(ARGV[i])
  server = server * decay + tonumber(ARGV[i + 1])
end
redis.call('HSET', KEYS[1], 'server', string.format('%.17g', server), 'estimate', string.format('%.17g', estimate))
return 1
"""
