"""A job's cost cap (``judging.cost_cap``) and token cap, and its tenant's daily limits, held on
Redis counters (the job's, and ``evalq:tenant:<t>:<kind>:<UTC day>`` across the tenant's jobs).

Cost. ``evalq:{J}:cost`` counts, in billionths of the prices' currency, what the job's calls
cost; beside it, ``...:held`` holds each call in flight (its hold id -> amount and the time it
lapses). Admission holds a call's worst case, its prompt's upper bound of tokens
(``evalq.shared.judging.tokens.prompt_token_bound``: an estimate can be low, and a server's count higher)
and ``max_tokens`` of completion at its deployment's price, in one script over every counter the
call counts on, so concurrent workers never pass a cap together: a call that would pass a cap
with what was spent is refused (``CostCapReached``: an item error); one that would pass it only
with the calls in flight waits for them (``CostWait``). The reply turns the hold into what the call
cost; a call that failed gives its hold back; a hold whose worker died lapses. So what a cap's
counter says was spent never passes the cap. An endpoint without a price holds nothing. Judge
calls and the model under test's calls count alike.

Tokens. ``evalq:{J}:tokens`` counts what the job's calls reserved (``estimate`` + ``max_tokens``):
a reservation is what counts, so it is taken at admission and never corrected.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timezone

import redis

from evalq.shared.cluster import keys
from evalq.shared.core.errors import MetricError, Skipped
from evalq.shared.judging.judges import NANO, Price

# KEYS: spent_1, held_1, spent_2, held_2, ...; ARGV: amount, hold id, lapses at (s), now-ttl pairs...
# -> 1 held; 0 wait (only the calls in flight stand in the way); -i: counter i is reached
HOLD_LUA = """
local amount, id, lapse = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local n = #KEYS / 2
local wait = false
for i = 1, n do
  local spent = tonumber(redis.call('GET', KEYS[2 * i - 1]) or '0')
  local cap = tonumber(ARGV[3 + 2 * i - 1])
  if spent + amount > cap then return -i end
  local held, flat = 0, redis.call('HGETALL', KEYS[2 * i])
  for j = 1, #flat, 2 do
    local value, dead = string.match(flat[j + 1], '^(%d+):([%d.]+)$')
    if value == nil or tonumber(dead) <= now then
      redis.call('HDEL', KEYS[2 * i], flat[j])
    else
      held = held + tonumber(value)
    end
  end
  if spent + held + amount > cap then wait = true end
end
if wait then return 0 end
for i = 1, n do
  redis.call('HSET', KEYS[2 * i], id, ARGV[1] .. ':' .. string.format('%.3f', now + lapse))
  local ttl = tonumber(ARGV[3 + 2 * i])
  redis.call('EXPIRE', KEYS[2 * i], math.max(ttl, math.ceil(lapse) + 60))
  if ttl > 0 and redis.call('TTL', KEYS[2 * i - 1]) < 0 then
    redis.call('INCRBY', KEYS[2 * i - 1], 0)
    redis.call('EXPIRE', KEYS[2 * i - 1], ttl)
  end
end
return 1
"""

HOLD_LAPSE = 3600.0  # seconds a call's hold lasts unsettled (a batch line's: until its deadline, or a day)
WAIT = 0.5           # seconds a call waits for the calls in flight before it tries again


@dataclass(frozen=True)
class Hold:
    """What one call holds of its cost counters: settled (``CostCap.settle``) or given back."""
    id: str
    amount: int

    def json(self) -> list:
        return [self.id, self.amount]


class CostWait(Exception):
    """Only the calls in flight stand between this call and a cap: try again when they settle."""

    def __init__(self, reached: str):
        super().__init__(reached)
        self.wait = WAIT


class CostCapReached(MetricError):
    """The job's cost cap leaves no room for this call: the item is an error, not a skip
    (unlike the token cap), so that ``n_errors`` tells that the cap cut the run short."""


@dataclass(frozen=True)
class Counter:
    key: str
    cap: int       # in the counter's unit: billionths of money, or tokens
    reached: str   # what an item says when it is reached
    ttl: int = 0   # seconds the counter lives (a tenant's day; a job's go with the job's keys)


def _day() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d")


def counters(job_id: str, tenant: str | None, kind: str, job_cap: float | None) -> list[Counter]:
    """The counters a call's ``kind`` ("cost" or "tokens") is held on: the job's cap, and the
    operator's daily limit of the job's tenant across all its jobs (EVALQ_TENANTS
    ``<tenant>.daily_cost`` / ``.daily_tokens``, UTC days), each where one is set."""
    from evalq.shared.cluster.scheduling import Tenants

    scale = NANO if kind == "cost" else 1
    found = []
    if job_cap is not None:
        found.append(Counter(keys.job_cost(job_id) if kind == "cost" else keys.job_tokens(job_id),
                             round(job_cap * scale), f"job {'cost' if kind == 'cost' else 'token'} cap of "
                             f"{job_cap:.15g} reached"))
    if tenant is not None:
        tenants = Tenants.from_env()
        daily = tenants.policy(tenants.daily_cost if kind == "cost" else tenants.daily_tokens, tenant)
        if daily is not None:
            found.append(Counter(keys.tenant_spend(tenant, kind, _day()), round(daily * scale),
                                 f"tenant {tenant!r}'s daily {kind} limit of {daily:.15g} reached (EVALQ_TENANTS)",
                                 ttl=keys.TENANT_SPEND_TTL))
    return found


class Held:
    """Amounts held on a set of counters at once: each is checked against its cap, and a refusal
    gives back what was held on the others."""

    def __init__(self, r: redis.Redis, held_on: list[Counter]):
        self.r, self.counters = r, held_on

    def take(self, amount: int, refused: type[Exception]) -> int:
        if not amount or not self.counters:
            return 0
        taken = []
        for c in self.counters:
            total = self.r.incrby(c.key, amount)
            if c.ttl and total == amount:  # a new day's counter
                self.r.expire(c.key, c.ttl)
            if total > c.cap:
                for k in [*taken, c.key]:
                    self.r.decrby(k, amount)
                raise refused(c.reached)
            taken.append(c.key)
        return amount

    def add(self, amount: int) -> None:
        for c in self.counters:
            if amount:
                self.r.incrby(c.key, amount)

    @property
    def keys(self) -> list[str]:
        return [c.key for c in self.counters]


class CostCap:
    """The job's cost cap and its tenant's daily cost, in billionths of the prices' currency."""

    def __init__(self, r: redis.Redis, job_id: str, cap: float | None, tenant: str | None = None):
        self.r, self.counters = r, counters(job_id, tenant, "cost", cap)
        self._hold = r.register_script(HOLD_LUA) if self.counters else None

    @property
    def keys(self) -> list[str]:
        return [c.key for c in self.counters]

    def hold(self, price: Price | None, prompt_tokens: int, max_tokens: int,
             lapse: float = HOLD_LAPSE) -> Hold | None:
        """Hold a call's worst case (``prompt_tokens``: the prompt's upper bound); None: nothing to
        hold (no cap, no price). A cap reached with what was spent (the job's, or its tenant's for
        the day) -> ``CostCapReached``; reached only with the calls in flight -> ``CostWait``."""
        if price is None or not self.counters:
            return None
        amount = price.cost_nano(prompt_tokens, max_tokens)
        if not amount:
            return None
        hold = Hold(uuid.uuid4().hex, amount)
        args: list = [amount, hold.id, lapse]
        for c in self.counters:
            args += [c.cap, c.ttl]
        done = int(self._hold(keys=[k for c in self.counters for k in (c.key, keys.cost_held(c.key))], args=args))
        if done == 1:
            return hold
        if done == 0:
            raise CostWait(self.counters[0].reached)
        raise CostCapReached(self.counters[-done - 1].reached)

    def release(self, hold: Hold | None) -> None:
        """The call was not paid for (refused, failed): its hold goes back."""
        if hold is not None:
            pipe = self.r.pipeline(transaction=True)
            release_ops(pipe, self.keys, hold)
            pipe.execute()

    def settle(self, hold: Hold | None, cost: int) -> None:
        """The reply is paid: what it cost counts instead of its hold."""
        if hold is not None:
            pipe = self.r.pipeline(transaction=True)
            settle_ops(pipe, self.keys, hold, cost)
            pipe.execute()


def settle_ops(pipe, counter_keys: list[str], hold, cost: int) -> None:
    """Into ``pipe``: the hold (a ``Hold``, its ``json()``, or an older worker's amount held on the
    counter itself) becomes what the call cost."""
    if isinstance(hold, int):
        for key in counter_keys:
            pipe.incrby(key, cost - hold)
        return
    hold_id = hold.id if isinstance(hold, Hold) else hold[0]
    for key in counter_keys:
        pipe.hdel(keys.cost_held(key), hold_id)
        if cost:
            pipe.incrby(key, cost)


def release_ops(pipe, counter_keys: list[str], hold) -> None:
    """Into ``pipe``: the hold goes back (the call was not paid for)."""
    if isinstance(hold, int):
        for key in counter_keys:
            pipe.decrby(key, hold)
        return
    hold_id = hold.id if isinstance(hold, Hold) else hold[0]
    for key in counter_keys:
        pipe.hdel(keys.cost_held(key), hold_id)


class TokenCap(Held):
    """The job's token cap (``judging.token_cap``) and its tenant's daily tokens: reached -> Skipped."""

    def __init__(self, r: redis.Redis, job_id: str, cap: int | None, tenant: str | None = None):
        super().__init__(r, counters(job_id, tenant, "tokens", cap))

    def check(self, tokens: int) -> int:
        return self.take(tokens, Skipped)

    def release(self, tokens: int) -> None:
        self.add(-tokens)


class Caps:
    """What one call holds of the job's caps and its tenant's daily limits: the tokens it reserves
    (``TokenCap``) and its worst-case cost (``CostCap``), taken together and given back together."""

    def __init__(self, r: redis.Redis, job_id: str, cost_cap: float | None, token_cap: int | None,
                 tenant: str | None = None):
        self.tokens = TokenCap(r, job_id, token_cap, tenant)
        self.cost = CostCap(r, job_id, cost_cap, tenant)

    def take(self, tokens: int, price: Price | None, prompt_bound: int, max_tokens: int,
             lapse: float = HOLD_LAPSE) -> Hold | None:
        """Reserve ``tokens`` (``Skipped`` when a token cap is reached) and hold the call's worst
        case (``CostCapReached``, ``CostWait``: the tokens go back)."""
        self.tokens.check(tokens)
        try:
            return self.cost.hold(price, prompt_bound, max_tokens, lapse)
        except (CostCapReached, CostWait):
            self.tokens.release(tokens)
            raise

    def give_back(self, tokens: int, hold: Hold | None) -> None:
        self.tokens.release(tokens)
        self.cost.release(hold)
