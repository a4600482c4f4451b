"""Items out for review (issue 75): the night's judged items most worth a person's time, chosen as the
final callback writes the log (each record read once), written as ``review.jsonl`` beside the outputs
and marked where people look.

A job asks for ``review.items`` a night (``EVALQ_REVIEW_ITEMS`` where it does not say; 0: none). Each
judge entry's items are weighed for:

- **panel disagreement**: a panel's members' scores differ by ``spread`` or more (2 points), the widest
  first;
- **near the threshold**: a score within ``band`` (0.5) of the edge between the last failing and the
  first passing score (``threshold - 0.5`` on an integer scale; a defect entry's severity likewise), the
  closest first;
- **changed since the baseline**: a verdict that flipped against the item's value in the suite's
  baseline (``evalq.results.history``; a rating without a threshold: a move of ``spread`` or more), the
  biggest move first;
- **at random**: ``random`` (0.2) of the items, drawn by a hash of the job and instance (the same on a
  callback run again), stratified by category (each category's share of the draw as its share of the
  items).

The reasons fill the night's number in that order, an item once with all its reasons; the random draw
comes from the items left. An item of a trace dataset is marked on its span and trace: a Phoenix span
annotation ``needs_review`` (label ``needs review``, the reasons as its explanation) and an MLflow trace
tag ``evalq.needs_review`` (the reasons), on the job's Phoenix and MLflow sinks.
"""

from __future__ import annotations

import hashlib
import heapq
import json
from dataclasses import dataclass, field
from typing import Any

from evalq.shared.scores.results import read

REASONS = ("panel disagreement", "near the threshold", "changed since the baseline", "at random")
TEXT_SHOWN = 500  # characters of an item's input and answer in the review file


@dataclass(order=True)
class Candidate:
    rank: float
    tie: str
    key: str = field(compare=False)
    position: int = field(compare=False)
    line: dict = field(compare=False)
    reasons: list = field(compare=False)


class Picker:
    """Weighs each judged item as its log line passes (``offer``), keeping the best few per reason."""

    def __init__(self, job_id: str, settings, entries: dict[str, tuple[str, str, dict]],
                 baseline: dict[tuple[str, str], dict[str, float]] | None = None):
        self.job_id, self.settings = job_id, settings
        self.entries = entries  # run key -> (name, aggregation kind, parameters) of its judge entries
        self.baseline = baseline or {}
        self.n = settings.items or 0
        self.best: dict[str, list[Candidate]] = {r: [] for r in REASONS[:3]}  # kept as min-heaps of -rank
        self.drawn: dict[str, list[tuple[int, str, int, dict]]] = {}  # category -> bottom-k (hash, key, position, line)
        self.seen: dict[str, int] = {}  # items per category

    def wants(self, key: str) -> bool:
        return self.n > 0 and key in self.entries

    def offer(self, key: str, position: int, text: str) -> None:
        line = json.loads(text)
        if line.get("error") is not None or "result" not in line or line.get("variant") is not None:
            return
        name, kind, params = self.entries[key]
        reading = read(kind, params, line)
        tie = f"{key}|{position}"
        value = reading.sample.get("severity", next(iter(reading.values.values()), None)) if reading.values else None
        found: list[tuple[str, float, str]] = []  # (reason, rank: higher first, why)
        members = _member_scores(line.get("result"))
        if len(members) >= 2 and max(members.values()) - min(members.values()) >= self.settings.spread:
            found.append(("panel disagreement", max(members.values()) - min(members.values()),
                          "scores " + ", ".join(f"{m} {v:g}" for m, v in sorted(members.items()))))
        threshold = params.get("threshold")
        if value is not None and isinstance(threshold, (int, float)) and kind in ("rating", "defect"):
            distance = abs(value - (threshold - 0.5))
            if distance <= self.settings.band:
                found.append(("near the threshold", -distance, f"{value:g} against the threshold {threshold:g}"))
        field_name = next(iter(reading.values), None)
        before = self.baseline.get((name, field_name or ""), {}).get(str(line.get("instance_id")))
        if value is not None and before is not None and field_name is not None:
            now = reading.values[field_name]
            if isinstance(threshold, (int, float)) and kind == "rating":
                flipped = (now >= threshold) != (before >= threshold)
            elif kind == "defect":
                flipped = round(now) != round(before)
            else:
                flipped = abs(now - before) >= self.settings.spread
            if flipped:
                found.append(("changed since the baseline", abs(now - before), f"{now:g} against {before:.3g} in the baseline"))
        reasons = [{"reason": reason, "why": why} for reason, _, why in found]
        for reason, rank, _ in found:
            self._keep(reason, rank, tie, key, position, line, reasons)
        category = str(line.get("category") or "")
        self.seen[category] = self.seen.get(category, 0) + 1
        draw = int.from_bytes(hashlib.blake2b(f"{self.job_id}|{key}|{line.get('instance_id')}".encode(),
                                              digest_size=8).digest(), "big")
        heap = self.drawn.setdefault(category, [])
        entry = (-draw, tie, position, line, key)
        if len(heap) < self.n:
            heapq.heappush(heap, entry)
        elif entry > heap[0]:
            heapq.heapreplace(heap, entry)

    def _keep(self, reason: str, rank: float, tie: str, key: str, position: int, line: dict, reasons: list) -> None:
        heap = self.best[reason]
        item = Candidate(rank, tie, key, position, line, reasons)
        if len(heap) < self.n:
            heapq.heappush(heap, item)
        elif item > heap[0]:
            heapq.heapreplace(heap, item)

    def pick(self) -> list[dict]:
        """The night's items for review, in order of reason: each with its reasons."""
        if self.n <= 0:
            return []
        chosen: dict[tuple[str, int], dict] = {}
        fixed = self.n - round(self.n * self.settings.random)
        for reason in REASONS[:3]:
            for item in sorted(self.best[reason], reverse=True):
                spot = (item.key, item.position)
                if spot not in chosen and len(chosen) < fixed:
                    chosen[spot] = _row(self.entries[item.key][0], item.key, item.position, item.line, item.reasons)
        total = sum(self.seen.values())
        left = self.n - len(chosen)
        for category, heap in sorted(self.drawn.items()):
            share = max(1, round(left * self.seen[category] / total)) if total else 0
            drawn = 0  # the category's first ``share`` not chosen for a reason (its heap holds enough beyond them)
            for _, tie, position, line, key in sorted(heap, reverse=True):
                if drawn >= share or len(chosen) >= self.n:
                    break
                if (key, position) not in chosen:
                    chosen[(key, position)] = _row(self.entries[key][0], key, position, line, [
                        {"reason": "at random", "why": f"drawn at random{' from ' + category if category else ''}"}])
                    drawn += 1
        return list(chosen.values())


def _member_scores(result: Any) -> dict[str, float]:
    members = result.get("members") if isinstance(result, dict) else None
    return {m: float(v["score"]) for m, v in (members or {}).items()
            if isinstance(v, dict) and isinstance(v.get("score"), (int, float)) and not isinstance(v.get("score"), bool)}


def _row(name: str, key: str, position: int, line: dict, reasons: list[dict]) -> dict:
    result = line.get("result")
    row = {"instance_id": line.get("instance_id"), "entry": line.get("entry"), "name": name, "metric": line.get("metric"),
           "position": position, "key": key, "result": result, "reasons": list(reasons)}
    if isinstance(line.get("otel"), dict):
        row["otel"] = line["otel"]
    if line.get("category") is not None:
        row["category"] = line["category"]
    return row


def with_texts(rows: list[dict], instances: dict[int, dict]) -> None:
    """Each row's input and answer (first ``TEXT_SHOWN`` characters), from its instance."""
    for row in rows:
        inst = instances.get(row["position"]) or {}
        for name in ("input", "actual-output"):
            if isinstance(inst.get(name), str):
                row[name] = inst[name][:TEXT_SHOWN]


def reasons_of(row: dict) -> str:
    return "; ".join(f"{r['reason']} ({r['why']})" for r in row["reasons"])


def said(rows: list[dict], marked: dict[str, int]) -> dict:
    """What run.json says of the night's review: how many, by reason, and what each sink took."""
    counts = {reason: sum(any(r["reason"] == reason for r in row["reasons"]) for row in rows) for reason in REASONS}
    return {"items": len(rows), "file": "review.jsonl", "reasons": {k: v for k, v in counts.items() if v},
            **({"marked": marked} if marked else {})}


def review_line(review: dict) -> str:
    """The report header's line."""
    if not review.get("items"):
        return "none chosen"
    reasons = ", ".join(f"{n} {reason}" for reason, n in review.get("reasons", {}).items())
    marked = "; marked in " + ", ".join(f"{name} ({n})" for name, n in review["marked"].items()) \
        if review.get("marked") else ""
    return f"{review['items']} item(s) in review.jsonl: {reasons}{marked}"


MARK_NAME = "needs_review"  # the Phoenix annotation's name
TAG = "evalq.needs_review"  # the MLflow trace tag's key


def mark(spec, job_id: str, rows: list[dict]) -> dict[str, int]:
    """Mark the chosen items of a trace dataset where people look, on the job's Phoenix and MLflow sinks:
    per sink, how many items it took (never fails the job: a sink that refuses is logged)."""
    import logging
    from urllib.parse import quote

    from evalq.results.sinks import named_sink
    from evalq.results.sinks.keeping import http_client

    log = logging.getLogger("evalq.review")
    traced = [row for row in rows if (row.get("otel") or {}).get("span_id")]
    marked: dict[str, int] = {}
    if not traced:
        return marked
    for name in spec.sinks:
        sink = named_sink(spec, name)
        if sink is None or sink.kind not in ("phoenix", "mlflow"):
            continue
        http = http_client(sink.name, sink.base)
        took = 0
        try:
            if sink.kind == "phoenix":
                for row in traced:
                    answer = http.post("/v1/span_annotations", params={"sync": "true"}, json={"data": [{
                        "span_id": row["otel"]["span_id"], "name": MARK_NAME, "annotator_kind": "CODE",
                        "identifier": f"{job_id}:review:{row['key']}",
                        "result": {"label": "needs review", "explanation": reasons_of(row)},
                        "metadata": {"evalq.job.id": job_id, "evalq.entry": row["key"],
                                     "evalq.instance.id": str(row["instance_id"])}}]})
                    took += answer.status_code == 200
            else:
                for row in traced:
                    trace = quote(f"tr-{row['otel'].get('trace_id')}", safe="")
                    answer = http.patch(f"/api/3.0/mlflow/traces/{trace}/tags",
                                        json={"key": TAG, "value": f"{row['name']}: {reasons_of(row)}"[:250]})
                    took += answer.status_code == 200
        except Exception as exc:  # noqa: BLE001  (a mark is a courtesy: the review file holds the items)
            log.warning("job %s: marking items for review in %s failed: %s", job_id, name, type(exc).__name__)
        marked[name] = took
    return marked


def baseline_means(past: dict) -> dict[tuple[str, str], dict[str, float]]:
    """Per (entry name, field): each instance's mean over the baseline runs that kept it."""
    from evalq.shared.scores.stats import columns

    out: dict[tuple[str, str], dict[str, float]] = {}
    for (_, name, field_name), rows in past.items():
        sums: dict[str, list[float]] = {}
        for row in rows:
            if row.get("items"):
                for iid, value in zip(*columns(row["items"])):
                    acc = sums.setdefault(iid, [0.0, 0])
                    acc[0] += value
                    acc[1] += 1
        out[(name, field_name)] = {iid: total / n for iid, (total, n) in sums.items()}
    return out
