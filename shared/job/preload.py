"""What a worker loads at start, before any chunk asks for it: ``EVALQ_PRELOAD``.

A model metric's first chunk on a fresh worker otherwise pays for importing torch (and
transformers, for a model that is not a plain BERT) and loading the model (about 3 s of a first
job on a CPU for the shipped MiniLM, more for a large model or a GPU's first kernels) while the
job waits. With ``EVALQ_PRELOAD`` the worker does that
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

import evalq.shared.job.catalogue  # noqa: F401  (first: the metrics and the plugins, which may import the job's modules)
from evalq.shared.core.errors import JobError, kind
from evalq.shared.job.entries import MetricRun, entry_params, entry_spec
from evalq.shared.metrics.registry import REGISTRY, MetricSpec

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

    def add(where: str, message: str) -> None:
        problems.append(f"{where}: {message}")

    out = []
    for i, entry in enumerate(raw):
        where = f"{ENV}[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            add(where, f"expected {{\"id\": \"<metric>\", \"parameters\": {{...}}}}, got {json.dumps(entry)[:80]}")
            continue
        if set(entry) - KEYS:
            add(where, f"unknown field(s) {', '.join(sorted(set(entry) - KEYS))} (allowed: id, parameters)")
            continue
        spec = entry_spec(where, entry["id"], add)
        if spec is None:
            continue
        if not spec.warm:
            add(where, f"{spec.id} loads no model, so there is nothing to preload "
                       f"(metrics that can be preloaded: {', '.join(warmable())})")
            continue
        params = entry_params(where, spec, entry.get("parameters"), add)
        if params is not None:
            out.append((spec, params))
    if problems:
        raise JobError(problems)
    return out


def setting(runs: list[MetricRun]) -> str:
    """The value that preloads what these entries of a job need ("" when none loads a model)."""
    entries = [{"id": run.spec.id, "parameters": run.params_json()} for run in runs if run.spec.warm]
    return json.dumps(entries) if entries else ""
