"""What a worker process knows of its judges' deployments between reads of Redis: each one's
estimator bias and failure streak, read at most once a ``FRESH`` interval and shared by every judge
client of the process, and the prompt counts replies reported, folded into the biases together
once an interval (and when a chunk ends).

A judge call used to read the bias (HMGET), the failure streak (GET), clear the streak (DEL) and
fold its count into the bias (HMGET, HSET): five Redis commands a call, for values that move
slowly (the bias is a decaying average over hundreds of calls; a deployment is drained after
``FAIL_THRESHOLD`` failures in a row). Read four times a second they cost next to nothing: a failure
any client of the process saw counts at once in what the others read, and a streak another worker
began is seen within an interval (issue 73).
"""

from __future__ import annotations

import threading
import time

from evalq.shared.cluster import keys
from evalq.workers.judge.budget import FAIL_THRESHOLD, Budget

FRESH = 0.25  # seconds a bias or a failure streak read from Redis is used before it is read again, and
#               prompt counts wait before they are folded in

_lock = threading.Lock()
_bias: dict[str, tuple[float, float]] = {}     # bias key -> (bias, read at)
_fails: dict[str, tuple[int, float]] = {}      # fail key -> (streak, read at)
_seen: dict[str, tuple[Budget, list[tuple[int, int]]]] = {}  # bias key -> (a budget of it, prompt counts)
_folded = [time.monotonic()]


class Standing:
    """The process's view of one judge client's deployments' budgets (``Budget`` objects, by region)."""

    def __init__(self, budgets: dict[str, Budget]):
        self.budgets = budgets

    def admission_tokens(self, region: str, estimated_prompt: int, max_tokens: int, floor: int = 0) -> int:
        budget = self.budgets[region]
        bias = _fresh(_bias, budget.bias_at(), budget.bias)
        return budget.admission_tokens(estimated_prompt, max_tokens, floor=floor, bias=bias)

    def healthy(self, region: str) -> bool:
        return self._streak(region) < FAIL_THRESHOLD

    def failed(self, region: str) -> None:
        budget = self.budgets[region]
        budget.failed()
        key = _fail_key(budget)
        with _lock:  # a failure this process saw counts at once
            streak, at = _fails.get(key, (0, time.monotonic()))
            _fails[key] = (streak + 1, at)

    def succeeded(self, region: str) -> None:
        """A streak is cleared where one was seen (one begun since clears within an interval)."""
        if self._streak(region) > 0:
            budget = self.budgets[region]
            budget.succeeded()
            with _lock:
                _fails[_fail_key(budget)] = (0, time.monotonic())

    def observe(self, region: str, estimated_prompt: int, server_prompt: int) -> None:
        budget = self.budgets[region]
        with _lock:
            _seen.setdefault(budget.bias_at(), (budget, []))[1].append((estimated_prompt, server_prompt))
            due = time.monotonic() - _folded[0] > FRESH
        if due:
            fold()

    def fold(self) -> None:
        fold()

    def _streak(self, region: str) -> int:
        budget = self.budgets[region]
        return _fresh(_fails, _fail_key(budget), budget.streak)


def fold() -> None:
    """The prompt counts seen since the last fold, into each deployment's bias."""
    with _lock:
        seen = dict(_seen)
        _seen.clear()
        _folded[0] = time.monotonic()
    for key, (budget, pairs) in seen.items():
        budget.observe_many(pairs)
        with _lock:
            _bias.pop(key, None)


def _fresh(known: dict, key: str, read):
    """``known[key]``'s value where it was read less than ``FRESH`` seconds ago, else ``read()``'s, kept."""
    with _lock:
        value = known.get(key)
    if value is None or time.monotonic() - value[1] > FRESH:
        value = (read(), time.monotonic())
        with _lock:
            known[key] = value
    return value[0]


def _fail_key(budget: Budget) -> str:
    return keys.budget(budget.dep_id, "fail")
