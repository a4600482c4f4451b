"""A job's cost cap (``judging.cost_cap``) and token cap, and its tenant's daily limits, held on
Redis counters (the job's, and ``evalq:tenant:<t>:<kind>:<UTC day>`` across the tenant's jobs).

``evalq:{J}:cost`` counts, in billionths of the prices' currency, what the
job's calls cost plus what the calls in flight may still cost. Admission holds
a call's worst case (its estimated prompt tokens and ``max_tokens`` of
completion at its deployment's price) with one INCRBY, so concurrent workers
never pass the cap together; the reply corrects the hold to what the call
cost, and a call that failed gives its hold back. An endpoint without a price
holds nothing. Judge calls and the model under test's calls count alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

import redis

from evalq.shared import keys
from evalq.shared.errors import MetricError, Skipped
from evalq.shared.judges import NANO, Price


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
    from evalq.shared.scheduling import Tenants

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
                                 ttl=3 * 86400))
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


class CostCap(Held):
    def __init__(self, r: redis.Redis, job_id: str, cap: float | None, tenant: str | None = None):
        super().__init__(r, counters(job_id, tenant, "cost", cap))

    def hold(self, price: Price | None, prompt_tokens: int, max_tokens: int) -> int:
        """Hold a call's worst case; what was held (0: nothing to hold). A cap reached (the job's,
        or its tenant's for the day) -> ``CostCapReached``, holding nothing."""
        if price is None:
            return 0
        return self.take(price.cost_nano(prompt_tokens, max_tokens), CostCapReached)

    def release(self, held: int) -> None:
        """The call was not paid for (refused, failed): its hold goes back."""
        self.add(-held)

    def settle(self, held: int, cost: int) -> None:
        """The reply is paid: count what it cost instead of its worst case."""
        if held:
            self.add(cost - held)


class TokenCap(Held):
    """The job's token cap (``judging.token_cap``) and its tenant's daily tokens: reached -> Skipped."""

    def __init__(self, r: redis.Redis, job_id: str, cap: int | None, tenant: str | None = None):
        super().__init__(r, counters(job_id, tenant, "tokens", cap))

    def check(self, tokens: int) -> int:
        return self.take(tokens, Skipped)

    def release(self, tokens: int) -> None:
        self.add(-tokens)
