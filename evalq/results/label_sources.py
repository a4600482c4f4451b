"""Where people's labels are read from (``evalq.results.labels``): a night's log lines (which items it
judged, their scores and the spans they judged), Phoenix span annotations and MLflow assessments.

- **A night's items**: its ``log.jsonl`` where the history store says its outputs went (a folder or
  S3), each judge entry's line per item: the instance id, the entry's name, the result, and for a
  trace dataset's item the ``otel`` ids (trace and span) that join a label on that span back to it.
- **Phoenix** (a sink of kind ``phoenix`` in ``EVALQ_SINKS``, with its ``EVALQ_SINK_<NAME>_HEADERS``):
  ``GET /v1/projects``, then per project ``GET /v1/projects/{id}/span_annotations`` for the night's
  span ids (100 a request, every page), keeping annotations by ``HUMAN`` annotators whose name is an
  entry's: ``result.score`` (else ``result.label`` read as a verdict), ``user_id`` (else
  ``metadata.annotator``) as who, ``updated_at`` as when, its ``id`` as its identity.
- **MLflow** (a sink of kind ``mlflow``): ``GET /api/3.0/mlflow/traces/tr-{trace id}`` per trace the
  night judged, keeping feedback assessments whose ``source.source_type`` is ``HUMAN``, whose name is
  an entry's and that no later assessment overrides: ``feedback.value``, ``source.source_id`` as who,
  ``last_update_time`` as when, its ``assessment_id`` as its identity. An assessment on a span is
  matched by the span, one on the trace by the trace when the night judged one item of it.
Only the operator's sinks are asked (a command line names them by name, never by URL).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterator

from evalq.results.labels import Label, number, when
from evalq.shared.core.errors import JobError

SPANS_PER_REQUEST = 100


@dataclass
class Night:
    """A night's judged items: (instance id, entry name) -> (metric, parameters, result), and the
    spans and traces they judged."""

    job_id: str
    items: dict[tuple[str, str], tuple[str, dict, Any]] = field(default_factory=dict)
    spans: dict[str, list[tuple[str, str]]] = field(default_factory=dict)   # span id -> [(instance, name)]
    traces: dict[str, set[str]] = field(default_factory=dict)              # trace id -> {instance ids}

    @property
    def names(self) -> set[str]:
        return {name for _, name in self.items}


def night_of(job_id: str, out: str | None, judged: set[str] | None = None) -> Night | None:
    """The night's judged items from its log (None where it wrote none, or it is gone)."""
    import evalq.shared.job.catalogue  # noqa: F401  (registers the built-in metrics)
    from evalq.shared.data.storage import read_lines
    from evalq.shared.metrics.registry import REGISTRY

    if not out:
        return None
    uri = out.rstrip("/") + "/log.jsonl"
    night = Night(job_id)
    try:
        for _, text in read_lines(uri):
            if not isinstance(text, str):
                continue
            line = json.loads(text)
            metric = line.get("metric")
            if metric not in REGISTRY or REGISTRY.get(metric).queue != "judge" or line.get("variant") is not None:
                continue
            name = str(line.get("name") or metric)
            if judged is not None and name not in judged:
                continue
            iid = str(line.get("instance_id"))
            night.items[(iid, name)] = (metric, line.get("parameters") or {}, line.get("result"))
            otel = line.get("otel") if isinstance(line.get("otel"), dict) else {}
            if otel.get("span_id"):
                night.spans.setdefault(str(otel["span_id"]), []).append((iid, name))
            if otel.get("trace_id"):
                night.traces.setdefault(str(otel["trace_id"]), set()).add(iid)
    except (JobError, OSError, ValueError):
        return None
    return night


def sink(name: str) -> tuple[str, str]:
    """(kind, base URL) of the operator's sink ``name``; a JobError naming the sinks there are otherwise."""
    from evalq.shared.core.config import score_sinks

    sinks = score_sinks()
    if name not in sinks or sinks[name][0] not in ("phoenix", "mlflow"):
        known = ", ".join(sorted(n for n, (k, _) in sinks.items() if k in ("phoenix", "mlflow"))) or "none"
        raise JobError(f"--from {name}: not a Phoenix or MLflow sink of the operator's EVALQ_SINKS (there: {known})")
    return sinks[name]


def _client(name: str, base: str):
    from evalq.results.sinks.keeping import http_client

    return http_client(name, base)


def phoenix_labels(name: str, base: str, night: Night) -> Iterator[tuple[Label, list[tuple[str, str]]]]:
    """Each HUMAN span annotation of the night's spans named as an entry, with the items it grades."""
    http = _client(name, base)
    projects = _get(http, "/v1/projects", {"limit": 1000}).get("data") or []
    spans = sorted(night.spans)
    names = night.names
    for project in projects:
        for start in range(0, len(spans), SPANS_PER_REQUEST):
            cursor = None
            while True:
                params: dict[str, Any] = {"span_ids": spans[start:start + SPANS_PER_REQUEST], "limit": 1000,
                                          "include_annotation_names": sorted(names)}
                if cursor:
                    params["cursor"] = cursor
                page = _get(http, f"/v1/projects/{project['id']}/span_annotations", params, missing_ok=True)
                for a in page.get("data") or []:
                    if a.get("annotator_kind") != "HUMAN" or a.get("name") not in names:
                        continue
                    result = a.get("result") or {}
                    value = number(result.get("score")) if result.get("score") is not None else number(result.get("label"))
                    if value is None:
                        continue
                    who = a.get("user_id") or (a.get("metadata") or {}).get("annotator") or "phoenix"
                    label = Label("", a["name"], value, str(who), "phoenix", str(a["id"]),
                                  when(a.get("updated_at") or a.get("created_at")), night.job_id)
                    yield label, [item for item in night.spans.get(str(a.get("span_id")), []) if item[1] == a["name"]]
                cursor = page.get("next_cursor")
                if not cursor:
                    break


def mlflow_labels(name: str, base: str, night: Night) -> Iterator[tuple[Label, list[tuple[str, str]]]]:
    """Each HUMAN feedback assessment on the night's traces named as an entry, with the items it grades."""
    from urllib.parse import quote

    http = _client(name, base)
    names = night.names
    for trace, instances in sorted(night.traces.items()):
        info = (_get(http, f"/api/3.0/mlflow/traces/{quote('tr-' + trace, safe='')}", {}, missing_ok=True)
                .get("trace") or {}).get("trace_info") or {}
        found = info.get("assessments") or []
        overridden = {a.get(key) for a in found for key in ("overrides", "overridden_assessment_id") if a.get(key)}
        for a in found:
            source = a.get("source") or {}
            if source.get("source_type") != "HUMAN" or a.get("assessment_name") not in names \
                    or a.get("assessment_id") in overridden or a.get("valid") is False or "feedback" not in a:
                continue
            value = number((a.get("feedback") or {}).get("value"))
            if value is None:
                continue
            entry = a["assessment_name"]
            if a.get("span_id"):
                items = [item for item in night.spans.get(str(a["span_id"]), []) if item[1] == entry]
            else:  # on the trace: its one judged item
                items = [(iid, entry) for iid in instances] if len(instances) == 1 else []
            label = Label("", entry, value, str(source.get("source_id") or "mlflow"), "mlflow", str(a["assessment_id"]),
                          when(a.get("last_update_time") or a.get("create_time")), night.job_id)
            yield label, items


def _get(http, path: str, params: dict, missing_ok: bool = False) -> dict:
    import httpx

    from evalq.shared.core.config import safe_url
    from evalq.shared.core.errors import InfraError

    where = safe_url(str(http.base_url).rstrip("/"))
    try:
        answer = http.get(path, params=params)
    except httpx.HTTPError as exc:
        raise InfraError(f"{where}: cannot read labels there: {type(exc).__name__}") from None
    if answer.status_code == 404 and missing_ok:
        return {}
    if answer.status_code != 200:
        raise InfraError(f"{where}: reading labels: HTTP {answer.status_code}: {answer.text[:200]}")
    return answer.json()
