"""Judges that retire (issue 75): a provider's model list says when a model stops answering, and a
nightly suite judged by it breaks on that date. OpenAI's ``GET /v1/models`` carries a
``shutdown_date`` (a date, or seconds since the epoch); Azure OpenAI's ``GET /openai/models`` a
``deprecation.inference``. evalq asks each judge deployment's provider for its list (``listing``:
the key goes only where the operator's ``EVALQ_ENDPOINTS`` lets it, else, on a user's own machine,
to the endpoints the job names, as an embedded run's workers do), reads the judge's model in it
(``shutdown_of``) and says which judges retire within ``EVALQ_RETIRE_WARN_DAYS`` days (30 by
default; ``retiring``). ``evalq validate --ask-providers`` says so before a night; a worker asks once
a deployment every 12 hours (``evalq.workers.judge.retiring``), and results.json's judge block
(``retires``) and report.html's header say it after one."""

from __future__ import annotations

import datetime
import os
from typing import Any, Callable, Iterable

WARN_ENV = "EVALQ_RETIRE_WARN_DAYS"
WARN_DAYS = 30
LOOK_TIMEOUT = 5.0  # seconds a provider has to list its models


def warn_days() -> int:
    from evalq.shared.core.config import env_number

    return max(0, int(env_number(WARN_ENV, WARN_DAYS)))


def as_date(value: Any) -> datetime.date | None:
    """A provider's date: ``2026-12-11`` (or a longer ISO time), or seconds since the epoch."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        try:
            return datetime.datetime.fromtimestamp(value, datetime.timezone.utc).date()
        except (OverflowError, OSError, ValueError):
            return None
    if isinstance(value, str) and value.strip():
        text = value.strip()
        try:
            return datetime.date.fromisoformat(text[:10])
        except ValueError:
            return None
    return None


def shutdown_of(listing: dict | None, model: str) -> datetime.date | None:
    """When ``model`` stops answering by a provider's model list (None: it says nothing of it)."""
    for entry in (listing or {}).get("data") or []:
        if not isinstance(entry, dict) or model not in (entry.get("id"), entry.get("model")):
            continue
        said = as_date(entry.get("shutdown_date"))
        deprecation = entry.get("deprecation")
        if said is None and isinstance(deprecation, dict):
            said = as_date(deprecation.get("inference"))
        if said is not None:
            return said
    return None


def listing(judge: Any, deployment: Any, url: str, policy: Any, timeout: float = LOOK_TIMEOUT) -> dict:
    """A deployment's model list from its provider at ``url`` (its endpoint), as JSON (``{"data":
    [...]}``). Raises what the call raised; ``PermissionError`` where the key may not go there
    (``policy``: an ``evalq.shared.policy.endpoints.EndpointPolicy``), ``KeyError`` where the key
    variable is not set here."""
    import openai

    refused = policy.problem(judge.api_key_env, url)
    if refused:
        raise PermissionError(refused)
    key = os.environ.get(judge.api_key_env)
    if not key:
        raise KeyError(judge.api_key_env)
    if judge.provider == "azure":
        client = openai.AzureOpenAI(azure_endpoint=deployment.endpoint, api_version=judge.api_version, api_key=key,
                                    max_retries=0, timeout=timeout)
    else:
        client = openai.OpenAI(base_url=deployment.base_url, api_key=key, max_retries=0, timeout=timeout)
    with client:
        return {"data": [m.to_dict() for m in client.models.list()]}


def retiring(judges: Iterable[tuple[str, Any]], shutdown: Callable[[Any, Any], datetime.date | None],
             today: datetime.date | None = None, days: int | None = None) -> list[dict]:
    """Per (judge name, config) and deployment whose model retires within ``days`` (default
    ``warn_days()``; already retired too): judge, model, region, date, days left. ``shutdown(judge,
    deployment)``: when its provider says the judge's model retires (None: it says nothing, or could
    not be asked)."""
    today = today or datetime.datetime.now(datetime.timezone.utc).date()
    days = warn_days() if days is None else days
    found = []
    for name, judge in judges:
        for d in judge.deployments:
            date = shutdown(judge, d)
            if date is not None and (date - today).days <= days:
                found.append({"judge": name, "model": judge.model, "region": d.region, "date": date.isoformat(),
                              "days": (date - today).days})
    return found


def gathered(blocks: Iterable[dict | None]) -> list[dict]:
    """The retirements of results.json's judge blocks (``retires``), each (judge, model, region) once."""
    found = {(f["judge"], f["model"], f["region"]): f for b in blocks for f in (b or {}).get("retires") or []}
    return [f for _, f in sorted(found.items())]


def said(found: dict) -> str:
    """A retirement in a line: ``judge 'gpt' (gpt-5, region lab): retires on 2026-12-11, in 12 days``."""
    days = found["days"]
    when = ("retired on" if days < 0 else "retires on") + f" {found['date']}" + (
        f", {-days} days ago" if days < 0 else ", today" if days == 0 else f", in {days} day{'s' if days != 1 else ''}")
    return f"judge {found['judge']!r} ({found['model']}, region {found['region']}): {when}"
