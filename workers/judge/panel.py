"""A panel of judges scoring one item (``evalq.shared.judging.panel`` says what a panel is).

The metric runs once per member, in parallel threads, each with the member's own judge client (its
deployments, its budget, its cache and memo identity); what each member gave (a score and a reason,
or the error that stopped it) is kept on the item, and the item's score is the panel's aggregate of
the members that answered. Fewer than ``quorum`` of them (default: all): the item fails with an error
naming who failed and why. A call waiting for a provider batch (``Pending``) or a task to be
deferred (``Deferred``, a Redis blip) stops the item as it would a single judge's.
"""

from __future__ import annotations

import contextvars
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from evalq.shared.core.errors import MetricError, Pending
from evalq.shared.judging.panel import combine
from evalq.workers.threads import measured


class Panel:
    """The members' judge clients of an entry whose parameters name a ``panel``."""

    def __init__(self, members: dict[str, Any], aggregate: str, quorum: int | None):
        self.members, self.aggregate = members, aggregate
        self.quorum = quorum or len(members)

    def score(self, fn: Callable, instance: dict, params: Any) -> dict:
        with ThreadPoolExecutor(len(self.members)) as pool:
            # each member's thread in a copy of this one's context: the item a keeper keeps rides there
            # (and its CPU seconds count for the chunk: evalq.workers.threads.measured)
            futures = {name: pool.submit(contextvars.copy_context().run, measured, fn, instance, params, client)
                       for name, client in self.members.items()}
            outcomes: dict[str, Any] = {}
            for name, future in futures.items():
                try:
                    outcomes[name] = future.result()
                except Exception as exc:  # noqa: BLE001  (kept per member; the panel decides below)
                    outcomes[name] = exc
        waiting = [d for o in outcomes.values() if isinstance(o, Pending) for d in o.digests]
        if waiting:
            raise Pending(*waiting)
        for o in outcomes.values():  # not a member's fault (a deferral, Redis away): the task's
            if _task_level(o):
                raise o
        members: dict[str, dict] = {}
        scores: dict[str, float] = {}
        for name, o in outcomes.items():
            if isinstance(o, Exception):
                members[name] = {"error": f"{type(o).__name__}: {o}"[:300]}
            else:
                members[name] = {"score": o["score"], "reason": o.get("reason", "")}
                scores[name] = float(o["score"])
        if len(scores) < self.quorum:
            failed = "; ".join(f"{name}: {m['error']}" for name, m in members.items() if "error" in m)
            raise MetricError(f"the panel's quorum is {self.quorum} of {len(self.members)} judges and "
                              f"{len(scores)} answered ({failed})")
        value, majority = combine(scores, self.aggregate)
        score: float | int = int(value) if float(value).is_integer() else value
        result = {"score": score, "reason": "; ".join(f"{name}: {m['reason']}" for name, m in members.items()
                                                       if "score" in m),
                  "members": members, "panel": self.aggregate}
        if majority is not None:
            result["majority"] = majority
        return result


def _task_level(outcome: Any) -> bool:
    import redis

    from evalq.shared.core.errors import Deferred
    from evalq.shared.store.place import StoreUnavailable

    return isinstance(outcome, (Deferred, redis.ConnectionError, redis.TimeoutError, StoreUnavailable))
