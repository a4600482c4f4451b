"""Scores as MLflow assessments: feedback on the trace an item judged (MLflow 3's REST API,
``POST /api/3.0/mlflow/traces/{trace_id}/assessments``, what ``mlflow.log_feedback`` sends).

Each evaluation becomes one feedback assessment: ``assessment_name`` the entry's (or
``<entry>.<field>``), ``feedback.value`` the score, ``rationale`` a judge's reason, ``span_id`` the
judged span, ``source`` the judge (``LLM_JUDGE``, with the entry's judge as ``source_id``) or evalq's
metric (``CODE``), and ``metadata`` naming the job, the entry, the event and the label. A trace that
OpenTelemetry sent to MLflow has the id ``tr-<trace id>``.

MLflow keeps every assessment written, so a second write would double it: the positions are marked
pending before they are sent (``keeping``), and one pending but not marked as taken (a worker died
between the two) is looked up on its trace first, by its event id, and sent only if MLflow does not
have it. A 404 naming the trace (it is not, or not yet, in MLflow) leaves that item unsent, tried
again at the job's end; a 404 or 405 at the path (no MLflow 3 there), a 400 (a refused schema), a
401 or 403 say it takes none. Evaluations go a few at a time in parallel (``PARALLEL``), since MLflow
takes one per request.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from evalq.results.sinks.keeping import Refused, Sink, http_client, judged
from evalq.shared.core.config import safe_url
from evalq.shared.traces.events import Evaluation

PARALLEL = 8
CANNOT = (400, 401, 403, 404, 405, 415, 501)
PATH = "/api/3.0/mlflow/traces"


def trace_id(ev: Evaluation) -> str:
    """The MLflow trace id of ``ev``'s trace, as a path segment (the sink sends only hex ids: ``Sink.takes``)."""
    from urllib.parse import quote

    return quote(f"tr-{ev.trace_id}", safe="")


def source(entry: dict) -> dict:
    """The assessment's source: the entry's judge, or evalq's metric."""
    if judged(entry):
        judge = (entry.get("parameters") or {}).get("judge")
        return {"source_type": "LLM_JUDGE", "source_id": str(judge or entry["id"])}
    return {"source_type": "CODE", "source_id": f"evalq/{entry['id']}"}


def _missing_trace(answer) -> bool:
    try:
        return answer.status_code == 404 and answer.json().get("error_code") == "RESOURCE_DOES_NOT_EXIST"
    except ValueError:
        return False


class MlflowSink(Sink):
    def __init__(self, name: str, base: str):
        super().__init__(name=name, kind="mlflow", endpoint=safe_url(base), idempotent=False, needs="trace",
                         batch=128)
        self.base = base

    def assessment(self, job_id: str, entry_key: str, entry: dict, ev: Evaluation) -> dict:
        metadata = {"evalq.job.id": job_id, "evalq.entry": entry_key, "evalq.event.id": ev.event_id,
                    "evalq.instance.id": ev.instance_id}
        if ev.label is not None:
            metadata["evalq.label"] = ev.label
        out = {"assessment_name": ev.name, "trace_id": trace_id(ev), "source": source(entry),
               "feedback": {"value": ev.value}, "metadata": metadata}
        if ev.span_id:
            out["span_id"] = ev.span_id
        if ev.explanation:
            out["rationale"] = ev.explanation
        return {"assessment": out}

    def send(self, job_id: str, entry_key: str, entry: dict, events: list[tuple[int, Evaluation]]) -> dict[int, str]:
        http = http_client(self.name, self.base)

        def one(event: tuple[int, Evaluation]):
            _, ev = event
            try:
                return http.post(f"{PATH}/{trace_id(ev)}/assessments",
                                 json=self.assessment(job_id, entry_key, entry, ev))
            except Exception as exc:  # the backend away: this one is not taken
                return exc

        with ThreadPoolExecutor(min(PARALLEL, len(events))) as pool:
            answers = list(pool.map(one, events))
        refused: dict[int, str] = {}
        failed: dict[int, str] = {}
        cannot = False
        for (p, _), answer in zip(events, answers):
            if isinstance(answer, Exception):
                failed[p] = f"{type(answer).__name__}: {answer}"
            elif answer.status_code == 200:
                continue
            elif _missing_trace(answer):
                refused[p] = f"404 {answer.text[:300]}"
            else:
                failed[p] = f"{answer.status_code} {answer.text[:300]}".strip()
                cannot = cannot or answer.status_code in CANNOT
        if failed:  # an item is taken when every one of its evaluations was
            taken = {p for p, _ in events} - set(failed) - set(refused)
            raise Refused(next(iter(failed.values())), cannot=cannot, taken=taken)
        return refused

    def already(self, job_id: str, events: list[tuple[int, Evaluation]]) -> set[str]:
        http = http_client(self.name, self.base)
        have: set[str] = set()
        for tid in sorted({trace_id(ev) for _, ev in events}):
            answer = http.get(f"{PATH}/{tid}")
            if answer.status_code == 404:
                continue  # not there: nothing of it was written
            if answer.status_code != 200:  # unknown: sent later, when it can be asked
                raise Refused(f"{answer.status_code} {answer.text[:300]}".strip(),
                              cannot=answer.status_code in CANNOT)
            info = (answer.json().get("trace") or {}).get("trace_info") or {}
            for a in info.get("assessments") or []:
                event = (a.get("metadata") or {}).get("evalq.event.id")
                if event and not a.get("overridden_assessment_id"):
                    have.add(event)
        return have

