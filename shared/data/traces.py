"""A dataset of OTLP JSON trace exports (``"format": "otlp"``), read in bounded memory.

``uri`` names a file, a folder or prefix (every file under it, in name order), or a glob
(``traces/2026-11-25/*.json.gz``, ``s3://bucket/otel/2026/11/25/**``); local or S3, plain or
gzip. Each line is one export request. Every span is counted; a span that is not GenAI is passed
by (counted); the GenAI spans that ``traces`` selects (``evalq.shared.traces.select``) are kept
in a spool file on disk (SQLite), so a night of a million spans holds a few rows in memory, and
come out as instances when the last file is read:

- the spans of one trace under an agent's span (``invoke_agent``, OpenInference ``AGENT``) form
  one run: the conversation its last model call was sent and answered, with its tool calls and
  results, scored by the agent metrics (``unit: "span"`` scores each chat span alone instead);
- chat spans that share a ``gen_ai.conversation.id`` (OpenInference ``session.id``) form one
  conversation, scored on its last span, whose messages hold every turn;
- any other chat span is an instance of its own: the last user message the ``input``, the answer
  the ``actual-output``.

Every instance's ``id`` is its span's id, and ``otel`` keeps its trace and span ids (where its
scores go back to), service, model, span name, conversation and start time. A line or span that
cannot be read is a located problem (file, line, place in the request, span id), as for any
dataset; never silently dropped.
"""

from __future__ import annotations

import fnmatch
import json
import sqlite3
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from evalq.shared.core.errors import JobError
from evalq.shared.data.storage import LineError, is_s3, read_lines, s3_client, s3_errors, split_s3
from evalq.shared.traces import genai
from evalq.shared.traces.otlp import Span, SpanError, read_request, spans_of
from evalq.shared.traces.select import TraceSelection

GLOB_CHARS = "*?["


@dataclass
class SpanCounts:
    """What the reading saw: spans read, not GenAI, left out by the filters or the sample,
    GenAI spans kept, and the instances they made (reported in run.json and by validate)."""
    files: int = 0
    spans: int = 0
    not_genai: int = 0
    filtered_out: int = 0
    sampled_out: int = 0
    kept: int = 0
    unreadable: int = 0
    chat_without_text: int = 0
    instances: dict[str, int] = field(default_factory=lambda: {"span": 0, "conversation": 0, "run": 0})

    def describe(self) -> str:
        made = ", ".join(f"{n:,} {kind}{'s' if n != 1 else ''}" for kind, n in self.instances.items() if n)
        return (f"OTLP traces: {self.files:,} file(s), {self.spans:,} spans ({self.not_genai:,} not GenAI, "
                f"{self.filtered_out:,} filtered out, {self.sampled_out:,} not in the sample, "
                f"{self.kept:,} kept{f', {self.unreadable:,} unreadable' if self.unreadable else ''}); "
                f"instances: {made or 'none'}")

    def as_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items()}


def files(uri: str, endpoint_url: str | None = None) -> list[str]:
    """The export files ``uri`` names: itself, what lies under it, or what its glob matches."""
    pattern = any(c in uri for c in GLOB_CHARS)
    if is_s3(uri):
        bucket, key = split_s3(uri)
        prefix = key[:min((key.index(c) for c in GLOB_CHARS if c in key), default=len(key))]
        if not pattern and key and not key.endswith("/"):
            return [uri]  # one object
        found = []
        with s3_errors(uri):
            pages = s3_client(uri, endpoint_url).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for page in pages:
                for obj in page.get("Contents") or []:
                    if not obj["Key"].endswith("/") and (not pattern or fnmatch.fnmatchcase(obj["Key"], key)):
                        found.append(f"s3://{bucket}/{obj['Key']}")
        if not found:
            raise JobError(f"{uri}: no objects {'match' if pattern else 'under this prefix'}")
        return sorted(found)
    path = Path(uri).expanduser()
    if pattern:
        base = Path(path.anchor) if path.is_absolute() else Path(".")
        rel = str(path.relative_to(path.anchor)) if path.is_absolute() else str(path)
        found = sorted(str(p) for p in base.glob(rel) if p.is_file())
        if not found:
            raise JobError(f"{uri}: no files match")
        return found
    if path.is_dir():
        found = sorted(str(p) for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        if not found:
            raise JobError(f"{uri}: the folder holds no files")
        return found
    if not path.exists():
        raise JobError(f"{uri}: no such file or folder")
    return [str(path)]


def read_spans(uri: str, endpoint_url: str | None, counts: SpanCounts) -> Iterator[Span | SpanError]:
    """Every span of every export file, in file and line order."""
    for name in files(uri, endpoint_url):
        counts.files += 1
        for number, text in read_lines(name, endpoint_url):
            where = f"{name} line {number}"
            if isinstance(text, LineError):
                yield SpanError(f"{where}: {text}")
                continue
            if not text.strip():
                continue
            try:
                request = read_request(text, where)
            except SpanError as exc:
                yield exc
                continue
            yield from spans_of(request, where)


class _Spool:
    """The kept GenAI spans, on disk: one row each, read back by trace and by conversation."""

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="evalq-otlp-")
        self.db = sqlite3.connect(str(Path(self._dir.name) / "spans.db"))
        self.db.execute("PRAGMA journal_mode=OFF")
        self.db.execute("PRAGMA synchronous=OFF")
        self.db.execute("CREATE TABLE spans (n INTEGER PRIMARY KEY, trace TEXT, kind TEXT, conv TEXT, "
                        "start INTEGER, span TEXT)")
        self._rows: list[tuple] = []

    def add(self, span: Span, kind: str) -> None:
        payload = json.dumps([span.trace_id, span.span_id, span.parent_id, span.name, span.start, span.end,
                              span.service, span.attributes, span.events, span.where], ensure_ascii=False)
        self._rows.append((span.trace_id, kind, genai.conversation(span), span.start, payload))
        if len(self._rows) >= 2000:
            self.flush()

    def flush(self) -> None:
        self.db.executemany("INSERT INTO spans (trace, kind, conv, start, span) VALUES (?, ?, ?, ?, ?)", self._rows)
        self._rows.clear()

    def query(self, sql: str, *args) -> Iterator[tuple]:
        yield from self.db.execute(sql, args)

    def close(self) -> None:
        self.db.close()
        self._dir.cleanup()


def _span(payload: str) -> Span:
    t, s, p, name, start, end, service, attrs, events, where = json.loads(payload)
    return Span(t, s, p, name, start, end, service, attrs, [tuple(e) for e in events], where)


def instances(uri: str, endpoint_url: str | None, selection: TraceSelection,
              counts: SpanCounts) -> Iterator[dict | SpanError]:
    """The instances the traces make (see the module's docstring), or located problems."""
    spool = _Spool()
    try:
        for item in read_spans(uri, endpoint_url, counts):
            if isinstance(item, SpanError):
                counts.unreadable += 1
                yield item
                continue
            counts.spans += 1
            kind = genai.kind(item)
            if kind is None:
                counts.not_genai += 1
                continue
            verdict = selection.verdict(item, kind)
            if verdict == "filtered":
                counts.filtered_out += 1
            elif verdict == "sampled":
                counts.sampled_out += 1
            else:
                counts.kept += 1
                spool.add(item, kind)
        spool.flush()
        spool.db.execute("CREATE INDEX by_trace ON spans (trace, start)")
        yield from _made(spool, selection, counts)
    finally:
        spool.close()


def _made(spool: _Spool, selection: TraceSelection, counts: SpanCounts) -> Iterator[dict | SpanError]:
    grouped = selection.unit == "auto"
    agent_traces = {t for (t,) in spool.query("SELECT DISTINCT trace FROM spans WHERE kind = 'agent'")} \
        if grouped else set()
    # agent runs, trace by trace
    for trace in sorted(agent_traces):
        spans = [_span(p) for (p,) in spool.query("SELECT span FROM spans WHERE trace = ? ORDER BY start, n", trace)]
        try:
            yield from _runs(spans, counts)
        except SpanError as exc:
            yield exc
    # conversations, then lone chat spans, in the order they started
    conversations: dict[str, Span] = {}
    for trace, payload in spool.query("SELECT trace, span FROM spans WHERE kind = 'chat' ORDER BY start, n"):
        if trace in agent_traces:
            continue
        span = _span(payload)
        conv = genai.conversation(span) if grouped else None
        if conv is not None:
            held = conversations.get(conv)
            if held is None or (span.end, span.start) >= (held.end, held.start):
                conversations[conv] = span
            continue
        yield from _one(span, "span", counts)
    for conv, span in sorted(conversations.items(), key=lambda kv: kv[1].start):
        yield from _one(span, "conversation", counts)


def _one(span: Span, unit: str, counts: SpanCounts) -> Iterator[dict | SpanError]:
    try:
        inst = genai.chat_instance(span)
    except SpanError as exc:
        yield exc
        return
    if inst is None:
        counts.chat_without_text += 1
        return
    if unit == "conversation":
        inp, out = genai.messages(span)
        inst["messages"] = [*inp, *out]
    counts.instances[unit] += 1
    yield inst


def _runs(spans: list[Span], counts: SpanCounts) -> Iterator[dict | SpanError]:
    """One run per outermost agent span of the trace, with the chat and tool spans under it."""
    by_id = {s.span_id: s for s in spans}
    agents = [s for s in spans if genai.kind(s) == "agent"]

    def root_of(span: Span) -> Span | None:
        found, seen = None, set()
        node = span
        while node is not None and node.span_id not in seen:
            seen.add(node.span_id)
            if genai.kind(node) == "agent":
                found = node
            node = by_id.get(node.parent_id) if node.parent_id else None
        return found

    members: dict[str, tuple[list[Span], list[Span]]] = {}
    for s in spans:
        if genai.kind(s) == "agent":
            continue
        root = root_of(s)
        if root is None:  # a model call of the trace outside any agent: scored alone
            if genai.kind(s) == "chat":
                yield from _one(s, "span", counts)
            continue
        chats, tools = members.setdefault(root.span_id, ([], []))
        (chats if genai.kind(s) == "chat" else tools).append(s)
    for agent in agents:
        if root_of(agent) is not agent:
            continue  # a sub-agent: part of the outer run
        chats, tools = members.get(agent.span_id, ([], []))
        inst = genai.run_instance(agent, chats, tools)
        if inst is not None:
            counts.instances["run"] += 1
            yield inst
