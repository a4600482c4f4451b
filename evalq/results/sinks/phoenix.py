"""Scores as Phoenix span annotations (Arize Phoenix's REST API, ``POST /v1/span_annotations``).

Each evaluation becomes an annotation on the span its item judged: ``name`` the entry's (or
``<entry>.<field>``), ``result`` {``score``, ``label``, ``explanation``}, ``annotator_kind`` ``LLM``
for a judge's entry and ``CODE`` for any other, and ``metadata`` naming the job, the entry, the
instance and the event. Its ``identifier`` is the evaluation's event id, so Phoenix replaces an
annotation written again (a chunk sent twice) instead of adding one: nothing is doubled.

Requests are synchronous (``sync=true``): Phoenix answers 404 naming the spans it does not have,
which are left unsent (tried again at the job's end, when the spans may have arrived) while the rest
of the request is sent again without them. A 404 or 405 at the path itself, a 422 (a refused
schema), a 401 or 403 (a refused credential) say it takes none: never asked again for the job.
"""

from __future__ import annotations

import re

from evalq.results.sinks.keeping import Refused, Sink, http_client, judged
from evalq.shared.core.config import safe_url
from evalq.shared.traces.events import Evaluation

CANNOT = (401, 403, 404, 405, 415, 422, 501)
_MISSING = re.compile(r"Spans? with IDs? (.*?) do(?:es)? not exist", re.S)


class PhoenixSink(Sink):
    def __init__(self, name: str, base: str):
        super().__init__(name=name, kind="phoenix", endpoint=safe_url(base), needs="span")
        self.base = base

    def body(self, job_id: str, entry_key: str, entry: dict, events: list[tuple[int, Evaluation]]) -> dict:
        kind = "LLM" if judged(entry) else "CODE"
        return {"data": [{
            "span_id": ev.span_id, "name": ev.name, "annotator_kind": kind, "identifier": ev.event_id,
            "result": {"score": ev.value, "label": ev.label, "explanation": ev.explanation},
            "metadata": {"evalq.job.id": job_id, "evalq.entry": entry_key, "evalq.event.id": ev.event_id,
                         "evalq.instance.id": ev.instance_id, "trace_id": ev.trace_id}} for _, ev in events]}

    def send(self, job_id: str, entry_key: str, entry: dict, events: list[tuple[int, Evaluation]]) -> dict[int, str]:
        refused: dict[int, str] = {}
        while events:
            answer = http_client(self.name, self.base).post("/v1/span_annotations", params={"sync": "true"},
                                                           json=self.body(job_id, entry_key, entry, events))
            if answer.status_code == 200:
                return refused
            text = f"{answer.status_code} {answer.text[:300]}".strip()
            missing = _MISSING.search(answer.text) if answer.status_code == 404 else None
            if missing:  # spans Phoenix does not have (yet): those items stay unsent, the rest goes again
                ids = {s.strip() for s in missing.group(1).split(",")}
                gone = {p for p, ev in events if ev.span_id in ids}
                if not gone:
                    raise Refused(text)
                refused.update({p: text for p in gone})
                events = [(p, ev) for p, ev in events if p not in gone]
                continue
            raise Refused(text, cannot=answer.status_code in CANNOT)
        return refused
