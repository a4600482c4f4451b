"""What each tenant spent today, kept in the job store, so that a Redis that loses it never resets a
daily limit (issue 72).

A tenant's daily limits (``EVALQ_TENANTS`` ``<tenant>.daily_cost`` / ``.daily_tokens``) are held on
Redis counters, one per tenant, kind and UTC day (``keys.tenant_spend``; ``evalq.workers.judge.cost``).
The sweeper of the ``evalq.jobs`` workers copies them, every ``COPY_EVERY`` seconds, into the store's
operator part (``<store>/_running/spend/<day>.json``: counter -> amount, only ever raised), and at
every sweep compares what Redis says with what it copied last: a counter lower than its copy is one
Redis lost (flushed, restarted empty, a replica promoted without the last writes), and is put back to
the copy (never lowered). What a loss can cost a limit is what was spent since the last copy.

A job's own caps (``judging.cost_cap``, ``token_cap``) are rebuilt with the job, from what its parts
say its calls spent (``evalq.orchestrator.rebuild``). Raising a tenant's limit is done in
``EVALQ_TENANTS``; deleting its counter in Redis does not lift it (the copy puts it back).
"""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime, timezone

import redis

from evalq.shared.cluster import keys

log = logging.getLogger("evalq.spend")

COPY_EVERY = 30.0  # seconds between copies of the counters into the store
FOLDER = "spend"  # in the store's ``_running`` part


class SpendCopy:
    """The day's counters as this process last copied them (one per ``evalq.jobs`` worker)."""

    def __init__(self):
        self.day: str | None = None
        self.kept: dict[str, int] = {}
        self.copied = 0.0

    def __call__(self, r: redis.Redis, root, now: float | None = None) -> list[str]:
        """One sweep's look (``root``: the store); sentences for the log, one per counter put back."""
        from evalq.orchestrator.rebuild import at_least
        from evalq.shared.store.ledger import running_place

        now = time.time() if now is None else now
        day = datetime.fromtimestamp(now, timezone.utc).strftime("%Y-%m-%d")
        if day != self.day:
            self.day, self.kept, self.copied = day, {}, 0.0
        copying = now - self.copied >= COPY_EVERY
        place, name = running_place(root), f"{FOLDER}/{day}.json"
        stored: dict[str, int] = {}
        if copying:
            stored = _read(place.get(name, missing_ok=True))
            self.kept = _highest(self.kept, stored)
            known = sorted(set(self.kept) | {k.decode() for k in r.scan_iter(match=keys.tenant_spend("*", "*", day),
                                                                               count=1000)})
        else:
            known = sorted(self.kept)
        current = {k: int(v or 0) for k, v in zip(known, r.mget(known))} if known else {}
        actions = []
        for counter, amount in self.kept.items():
            if current.get(counter, 0) < amount:  # Redis lost it: back to what the store had
                at_least(r, counter, amount, keys.TENANT_SPEND_TTL)
                actions.append(f"{counter}: put back to {amount} from the job store (Redis had "
                               f"{current.get(counter, 0)})")
                current[counter] = amount
        self.kept = _highest(self.kept, current)
        if copying:
            self.copied = now
            if self.kept != stored:
                place.put(name, json.dumps(self.kept, sort_keys=True).encode("utf-8"))
        return actions


def _read(raw: bytes | None) -> dict[str, int]:
    try:
        data = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return {k: int(v) for k, v in data.items() if isinstance(k, str) and k.startswith(f"{keys.PREFIX}:tenant:")
            and isinstance(v, int) and not isinstance(v, bool) and v >= 0} if isinstance(data, dict) else {}


def _highest(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: max(a.get(k, 0), b.get(k, 0)) for k in sorted(set(a) | set(b))}


COPY = SpendCopy()


def keep_spend(r: redis.Redis) -> list[str]:
    """The sweeper's look at the tenants' daily spend (``EVALQ_STORE`` unset: nothing)."""
    from evalq.shared.store.place import StoreUnavailable, store_root

    root = store_root()
    if root is None:
        return []
    try:
        actions = COPY(r, root)
    except StoreUnavailable as exc:
        log.error("the tenants' daily spend could not be kept in the job store: %s", exc)
        return []
    for action in actions:
        log.warning("tenant spend %s", action)
    return actions
