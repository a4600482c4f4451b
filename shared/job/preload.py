"""What a worker loads at start, before any chunk asks for it: ``EVALQ_PRELOAD``.

A model metric's first chunk on a fresh worker otherwise pays for importing torch and
transformers and loading the model (4 to 5 s on a CPU for the shipped MiniLM, more for a large
model or a GPU's first kernels) while the job waits. With ``EVALQ_PRELOAD`` the worker does that
in a thread as it starts, beside Celery's own start and the job's submission.

The setting is the operator's (a deployment's environment; ``evalq run`` sets it for its own
embedded workers from the job it runs, unless the environment already has it), never a job's.
Its value: metric entries as a job lists them, ``[{"id": "bertscore", "parameters": {...}}]``,
or metric ids separated by commas for their default parameters (``bertscore,toxicity``). Only
metrics with a ``warm`` hook (``MetricSpec.warm``) can be named; each entry's parameters are
validated as a job's are, and a worker loads only the entries of the queues it consumes.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

import evalq.shared.job.catalogue  # noqa: F401  (first: the metrics and the plugins, which may import the job's modules)
from evalq.shared.core.errors import JobError, kind
from evalq.shared.job.entries import MetricRun, param_errors
from evalq.shared.metrics.registry import REGISTRY, MetricSpec, UnknownMetric

ENV = "EVALQ_PRELOAD"
KEYS = {"id", "parameters"}


def warmable() -> list[str]:
    return [s.id for s in REGISTRY.all() if s.warm]


def parse(text: str) -> list[tuple[MetricSpec, Any]]:
    """The (metric, parameters) entries the setting names; JobError listing every problem."""
    text = (text or "").strip()
    if not text:
        return []
    if text.startswith("["):
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise JobError(f"{ENV}: not valid JSON ({exc})") from None
        if not isinstance(raw, list):
            raise JobError(f"{ENV}: expected a list of metric entries, got {kind(raw)}")
    else:
        raw = [{"id": part.strip()} for part in text.split(",") if part.strip()]
    problems: list[str] = []
    out = []
    for i, entry in enumerate(raw):
        where = f"{ENV}[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            problems.append(f"{where}: expected {{\"id\": \"<metric>\", \"parameters\": {{...}}}}, "
                            f"got {json.dumps(entry)[:80]}")
            continue
        if set(entry) - KEYS:
            problems.append(f"{where}: unknown field(s) {', '.join(sorted(set(entry) - KEYS))} (allowed: id, parameters)")
            continue
        try:
            spec = REGISTRY.get(entry["id"])
        except UnknownMetric as exc:
            problems.append(f"{where}: {exc}")
            continue
        if not spec.warm:
            problems.append(f"{where}: {spec.id} loads no model, so there is nothing to preload "
                            f"(metrics that can be preloaded: {', '.join(warmable())})")
            continue
        params_raw = entry.get("parameters") or {}
        if not isinstance(params_raw, dict):
            problems.append(f"{where}.parameters: expected an object, got {kind(params_raw)}")
            continue
        try:
            params = spec.params.model_validate(params_raw)
        except ValidationError as exc:
            problems.extend(f"{where}.parameters: {message}" for message in param_errors(exc, spec))
            continue
        out.append((spec, params))
    if problems:
        raise JobError(problems)
    return out


def setting(runs: list[MetricRun]) -> str:
    """The value that preloads what these entries of a job need ("" when none loads a model)."""
    entries = [{"id": run.spec.id, "parameters": run.params_json()} for run in runs if run.spec.warm]
    return json.dumps(entries) if entries else ""
