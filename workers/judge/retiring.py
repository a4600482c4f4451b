"""A judge worker asks each deployment's provider, once every 12 hours across the cluster, when the
judge's model retires (``evalq.shared.judging.retirement``): the chunk that finds it due asks before
its first call (one model list, within 5 s), so what it says is there before any of the chunk's items
is; a provider that lists no models (or no key to ask with) is asked again 12 hours later. What it
said waits in Redis (``keys.retires``) for the final callback, which puts a retirement within
``EVALQ_RETIRE_WARN_DAYS`` in results.json's judge block and report.html's header."""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

import redis

from evalq.shared.cluster import keys

log = logging.getLogger("evalq.worker")

EVERY = 12 * 3600  # seconds between two askings of one deployment, across the cluster
LOOK = 600.0  # seconds between two looks of this process at whether a deployment is due

_looked: dict[str, float] = {}
_lock = threading.Lock()


def look(r: redis.Redis, judge: Any) -> None:
    """Ask, where it is due, each of ``judge``'s deployments' providers."""
    from evalq.shared.policy.endpoints import endpoint_url

    for d in getattr(judge, "deployments", None) or []:
        key = keys.retires(judge.provider, endpoint_url(judge.provider, d), judge.model)
        now = time.monotonic()
        with _lock:
            if now - _looked.get(key, -LOOK) < LOOK:
                continue
            _looked[key] = now
        try:
            due = r.set(key, json.dumps({"asking": time.time()}), nx=True, ex=EVERY)
        except redis.RedisError:
            continue  # asked at the next look; a call's own Redis use says what is wrong
        if due:
            _ask(r, judge, d, key)


def _ask(r: redis.Redis, judge: Any, d: Any, key: str) -> None:
    from evalq.shared.judging.retirement import listing, shutdown_of
    from evalq.shared.policy.endpoints import endpoint_url, worker_policy

    try:  # the key only where this worker's EVALQ_ENDPOINTS lets it go, as its calls
        date = shutdown_of(listing(judge, d, endpoint_url(judge.provider, d), worker_policy()), judge.model)
        said = {"model": judge.model, "region": d.region, "shutdown": date.isoformat() if date else None,
                "asked": time.time()}
    except Exception as exc:  # noqa: BLE001  (a provider without a model list, a key not set: not the night's fault)
        log.info("judge %s region %s: its model list was not read: %s: %s", judge.model, d.region,
                 type(exc).__name__, str(exc)[:200])
        said = {"model": judge.model, "region": d.region, "shutdown": None, "error": type(exc).__name__,
                "asked": time.time()}
    try:
        r.set(key, json.dumps(said), ex=EVERY)
    except redis.RedisError:
        pass
