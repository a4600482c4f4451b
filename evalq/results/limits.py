"""How a deployment's learned limits moved (issue 62; ``evalq.shared.judging.capacity``): the
history the workers keep in Redis, read for run.json's ``judge.limits``."""

from __future__ import annotations

import json

from evalq.shared.cluster import keys


def history(r, dep_id: str, since: float = 0.0, until: float | None = None) -> list[dict]:
    """A deployment's limit changes between ``since`` and ``until`` (Redis server time, seconds),
    oldest first: ``{"t", "tpm"?, "rpm"?, "concurrency"?, "reason"}``; with the value in force at
    ``since`` first, when one was."""
    rows = []
    for raw in r.lrange(keys.budget(dep_id, "limits"), 0, -1):
        try:
            rows.append(json.loads(raw))
        except ValueError:
            continue
    rows.sort(key=lambda row: row.get("t", 0))
    before = [row for row in rows if row.get("t", 0) < since]
    kept = [row for row in rows if since <= row.get("t", 0) and (until is None or row["t"] <= until)]
    if before:
        state: dict = {}
        for row in before:
            state.update({k: v for k, v in row.items() if k in ("tpm", "rpm", "concurrency")})
        kept.insert(0, {"t": since, **state, "reason": "in force"})
    return kept


def limits_during(r, config: dict, job_id: str, since: float) -> dict[str, list[dict]]:
    """The limit history of each learning deployment of an endpoint (a judge's or the model's
    ``config`` as the spec stores it) since ``since``: what run.json shows under ``judge.limits``."""
    from types import SimpleNamespace

    from evalq.shared.judging.deployments import inline_scope
    from evalq.shared.judging.judges import Deployment, deployment_id

    who = SimpleNamespace(provider=config.get("provider"), model=config.get("model"))
    found: dict[str, list[dict]] = {}
    for raw in config.get("deployments") or []:
        d = Deployment.model_validate(raw)
        if not d.learns:
            continue
        if d.use is None:
            d = d.with_scope(inline_scope(job_id))
        rows = history(r, deployment_id(who, d), since)
        if rows:
            found[d.region] = rows
    return found
