"""A job's cost cap (``judging.cost_cap``), held on one Redis counter per job.

``evalq:{J}:cost`` counts, in billionths of the prices' currency, what the
job's calls cost plus what the calls in flight may still cost. Admission holds
a call's worst case (its estimated prompt tokens and ``max_tokens`` of
completion at its deployment's price) with one INCRBY, so concurrent workers
never pass the cap together; the reply corrects the hold to what the call
cost, and a call that failed gives its hold back. An endpoint without a price
holds nothing. Judge calls and the model under test's calls count alike.
"""

from __future__ import annotations

import redis

from evalq.shared import keys
from evalq.shared.errors import MetricError
from evalq.shared.judges import NANO, Price


class CostCapReached(MetricError):
    """The job's cost cap leaves no room for this call: the item is an error, not a skip
    (unlike the token cap), so that ``n_errors`` tells that the cap cut the run short."""


class CostCap:
    def __init__(self, r: redis.Redis, job_id: str, cap: float | None):
        self.r = r
        self.key = keys.job_cost(job_id)
        self.cap = cap

    def hold(self, price: Price | None, prompt_tokens: int, max_tokens: int) -> int:
        """Hold a call's worst case; what was held (0: nothing to hold). The cap
        reached -> ``CostCapReached``, holding nothing."""
        if self.cap is None or price is None:
            return 0
        worst = price.cost_nano(prompt_tokens, max_tokens)
        if not worst:
            return 0
        if self.r.incrby(self.key, worst) > round(self.cap * NANO):
            self.r.decrby(self.key, worst)
            raise CostCapReached(f"job cost cap of {self.cap:.15g} reached")  # 25, not 25.0
        return worst

    def release(self, held: int) -> None:
        """The call was not paid for (refused, failed): its hold goes back."""
        if held:
            self.r.decrby(self.key, held)

    def settle(self, held: int, cost: int) -> None:
        """The reply is paid: count what it cost instead of its worst case."""
        if held and cost != held:
            self.r.incrby(self.key, cost - held)
