"""What a judge entry's prompt is, as a digest: part of the entry's judge identity (issue 61).

A judge's verdicts change when its model, the model's version, its deployment, or what it is asked
changes: the metric's prompt, a rubric, few-shot examples, the reply's schema. The last are known
only to the metric's implementation, which builds the messages; so the worker that scores the
entry's first chunk asks it, once, to build them for a stand-in instance whose every field is a
placeholder, catches the request before anything is sent, and keeps the digest of what would have
gone (messages, schema, and the judge's sampling settings) in ``keys.judge_seen`` (``prompt``). The
same prompt, rubric and examples give the same digest on every run; any edit gives another.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

log = logging.getLogger("evalq.judge")

# a stand-in instance: each field the metric reads, as a placeholder naming it
LISTS = {"expected-output", "contexts", "retrieved_contexts"}


class _Asked(Exception):
    def __init__(self, request: dict):
        super().__init__("probe")
        self.request = request


class _Probe:
    """A judge that answers nothing: it keeps the first request and stops the metric there."""

    def __init__(self, settings: dict):
        self.settings = settings

    def complete(self, messages: list[dict], schema: dict | None = None, schema_name: str = "rating", **_: Any):
        raise _Asked({"messages": messages, "schema": schema, "schema_name": schema_name, **self.settings})


def stand_in(fields: tuple[str, ...]) -> dict:
    out: dict[str, Any] = {"id": "probe"}
    for name in fields:
        out[name] = [f"<{name}>"] if name in LISTS else f"<{name}>"
    return out


def prompt_digest(spec: Any, params: Any, judge: Any) -> str | None:
    """The sha256 of the first request the entry's metric would send for a stand-in instance, or None
    where the metric cannot build one without real data (a trajectory's messages, a prepared model):
    the entry's identity then rests on its parameters, which the history keeps anyway."""
    settings = {k: getattr(judge, k, None) for k in ("temperature", "max_tokens", "output")}
    try:
        fn = spec.load()
        instance = stand_in(spec.required(params))
        if spec.prepare:
            return None
        fn([instance], params, _Probe(settings)) if spec.batch else fn(instance, params, _Probe(settings))
    except _Asked as asked:
        return hashlib.sha256(json.dumps(asked.request, sort_keys=True, ensure_ascii=False,
                                         default=str).encode("utf-8")).hexdigest()
    except Exception as exc:  # noqa: BLE001  (a metric that needs real data: no digest)
        log.debug("no prompt digest for %s: %s", getattr(spec, "id", spec), exc)
    return None


_SEEN: set[tuple[str, str]] = set()  # (job, entry) whose digest this process kept


def note_prompt(r: Any, job_id: str, metric_key: str, spec: Any, params: Any, judge: Any, ttl: int) -> None:
    """Keep the entry's prompt digest once per job (the first chunk's worker wins; the same metric and
    parameters give every worker the same digest), once per process."""
    if (job_id, metric_key) in _SEEN:
        return
    if len(_SEEN) > 4096:
        _SEEN.clear()
    _SEEN.add((job_id, metric_key))
    digest = prompt_digest(spec, params, judge)
    if digest is None:
        return
    from evalq.shared.cluster import keys

    pipe = r.pipeline(transaction=False)
    pipe.hsetnx(keys.judge_seen(job_id, metric_key), "prompt", digest)
    pipe.expire(keys.judge_seen(job_id, metric_key), ttl)
    pipe.execute()
