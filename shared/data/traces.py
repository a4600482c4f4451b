"""A dataset of OTLP JSON trace exports (``"format": "otlp"``), read in bounded memory.

``uri`` names a file, a folder or prefix (every file under it, in name order), or a glob
(``traces/2026-11-25/*.json.gz``, ``s3://bucket/otel/2026/11/25/**``, with ``{a,b}`` alternatives:
``otel/{2026/11/25,2026/11/26}/**``); local or S3, plain or gzip. Each line is one export request. Every span is counted; a span that is not GenAI is passed
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
import re
import sqlite3
import tempfile
from array import array
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from evalq.shared.core.bounds import TRACE_SPANS_ENV, trace_spans_limit
from evalq.shared.core.errors import JobError
from evalq.shared.data.instances import BadRecords, InstanceChecker, LoadedDataset, SpooledInstances, said
from evalq.shared.data.storage import LineError, is_s3, read_lines, s3_client, s3_errors, split_s3
from evalq.shared.traces import genai
from evalq.shared.traces.otlp import Span, SpanError, read_request, spans_of
from evalq.shared.traces.select import TraceSelection

if TYPE_CHECKING:  # a type only: the spec is read through its fields
    from evalq.shared.data.dataset import DatasetSpec

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
    repeated: int = 0             # the same span (trace and span id) read again: kept once
    chat_without_text: int = 0
    instances: dict[str, int] = field(default_factory=lambda: {"span": 0, "conversation": 0, "run": 0})

    def describe(self) -> str:
        made = ", ".join(f"{n:,} {kind}{'s' if n != 1 else ''}" for kind, n in self.instances.items() if n)
        return (f"OTLP traces: {self.files:,} file(s), {self.spans:,} spans ({self.not_genai:,} not GenAI, "
                f"{self.filtered_out:,} filtered out, {self.sampled_out:,} not in the sample, "
                f"{self.kept:,} kept{f', {self.unreadable:,} unreadable' if self.unreadable else ''}"
                f"{f', {self.repeated:,} read twice' if self.repeated else ''}); "
                f"instances: {made or 'none'}")

    def as_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items()}


def expand_braces(uri: str) -> list[str]:
    """``traces/{2026/11/25,2026/11/26}/**`` as its alternatives, in order (as a shell expands them)."""
    m = re.search(r"\{([^{}]*)\}", uri)
    if m is None:
        return [uri]
    return [out for alt in m.group(1).split(",") for out in expand_braces(uri[:m.start()] + alt + uri[m.end():])]


class LinkedOutside(JobError):
    """A file a folder walk or glob found leads outside the roots a request may read."""


def _inside(uri: str, found: list[str], roots: list[Path] | None) -> list[str]:
    """``found`` (local files), each of whose real paths (links followed) lies under ``roots``; a
    request's folder may hold a link out of it, which is refused unread, naming the link only."""
    from evalq.shared.policy.egress import outside_roots

    if roots is not None:
        for name in found:
            if outside_roots(name, roots):
                raise LinkedOutside(f"{uri}: {name} is a link to a place outside the directories this cluster "
                                    "reads for the request; not read")
    return found


def files(uri: str, endpoint_url: str | None = None, roots: list[Path] | None = None) -> list[str]:
    """The export files ``uri`` names: itself, what lies under it, or what its glob matches; a
    ``{a,b}`` in it names each alternative's files in turn. With ``roots`` (a queue request's), a
    local file whose real path is outside them (a link in the request's own folder) is refused."""
    alternatives = expand_braces(uri)
    if len(alternatives) > 1:  # an alternative with nothing in it (today's partition, early) is passed by
        found: list[str] = []
        for alt in alternatives:
            try:
                found += files(alt, endpoint_url, roots)
            except LinkedOutside:
                raise
            except JobError:
                continue
        if not found:
            raise JobError(f"{uri}: no files match any of its alternatives")
        return list(dict.fromkeys(found))
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
        return _inside(uri, found, roots)
    if path.is_dir():
        found = sorted(str(p) for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        if not found:
            raise JobError(f"{uri}: the folder holds no files")
        return _inside(uri, found, roots)
    if not path.exists():
        raise JobError(f"{uri}: no such file or folder")
    return _inside(uri, [str(path)], roots)


def read_spans(uri: str, endpoint_url: str | None, counts: SpanCounts,
               roots: list[Path] | None = None) -> Iterator[Span | SpanError]:
    """Every span of every export file, in file and line order; all the files together are held
    to ``EVALQ_MAX_DATASET_BYTES``, as one dataset file is (each file is also held to it as it is
    read, decompressed, by ``read_lines``)."""
    from evalq.shared.core.limits import Limits, size

    limit, total = Limits.from_env().dataset_bytes, 0
    for name in files(uri, endpoint_url, roots):
        counts.files += 1
        for number, text in read_lines(name, endpoint_url):
            where = f"{name} line {number}"
            total += len(text) + 1
            if total > limit:
                raise JobError(f"{where}: stopped reading: the trace files are larger than {size(limit)} together "
                               "(EVALQ_MAX_DATASET_BYTES)")
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
        self.db.execute("CREATE TABLE spans (n INTEGER PRIMARY KEY, trace TEXT, sid TEXT, kind TEXT, conv TEXT, "
                        "start INTEGER, stop INTEGER, span TEXT, UNIQUE (trace, sid))")
        self.repeats = 0  # spans read twice (a Collector's retried export): kept once
        self._rows: list[tuple] = []

    def add(self, span: Span, kind: str) -> None:
        payload = json.dumps([span.trace_id, span.span_id, span.parent_id, span.name, span.start, span.end,
                              span.service, span.attributes, span.events, span.where], ensure_ascii=False)
        self._rows.append((span.trace_id, span.span_id, kind, genai.conversation(span), span.start, span.end, payload))
        if len(self._rows) >= 2000:
            self.flush()

    def flush(self) -> None:
        added = self.db.executemany("INSERT OR IGNORE INTO spans (trace, sid, kind, conv, start, stop, span) "
                                    "VALUES (?, ?, ?, ?, ?, ?, ?)", self._rows).rowcount
        self.repeats += len(self._rows) - added
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
              counts: SpanCounts, roots: list[Path] | None = None) -> Iterator[dict | SpanError]:
    """The instances the traces make (see the module's docstring), or located problems."""
    spool = _Spool()
    try:
        for item in read_spans(uri, endpoint_url, counts, roots):
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
        counts.kept, counts.repeated = counts.kept - spool.repeats, spool.repeats
        spool.db.execute("CREATE INDEX by_trace ON spans (trace, start)")
        spool.db.execute("CREATE TABLE agents (trace TEXT PRIMARY KEY)")
        if selection.unit == "auto":  # the traces that hold an agent's run
            spool.db.execute("INSERT OR IGNORE INTO agents SELECT trace FROM spans WHERE kind = 'agent'")
        yield from _made(spool, selection, counts)
    finally:
        spool.close()


def _too_many(spool: _Spool, group: str, where: str, limit: int) -> dict[str, int]:
    """The groups (traces, conversations) of more than ``limit`` spans: {group: spans}."""
    if not limit:
        return {}
    return dict(spool.query(f"SELECT {group}, COUNT(*) FROM spans WHERE {where} GROUP BY {group} "
                            "HAVING COUNT(*) > ?", limit))


def _over(what: str, n: int, limit: int) -> SpanError:
    return SpanError(f"{what}: {n:,} GenAI spans, more than {TRACE_SPANS_ENV} ({limit:,}) allows one run "
                     "or conversation: not scored (raise the limit, or leave spans out with traces.span_names)")


def _made(spool: _Spool, selection: TraceSelection, counts: SpanCounts) -> Iterator[dict | SpanError]:
    """Instances from the spool, streamed by SQLite (one trace, or one span, in memory at a time;
    a trace or conversation of more than ``EVALQ_MAX_TRACE_SPANS`` spans is a located problem)."""
    lone = "kind = 'chat' AND trace NOT IN (SELECT trace FROM agents)"
    limit = trace_spans_limit()
    # agent runs, trace by trace
    big = _too_many(spool, "trace", "trace IN (SELECT trace FROM agents)", limit)
    rows = spool.query("SELECT s.trace, s.span FROM spans s JOIN agents a ON a.trace = s.trace "
                       "ORDER BY s.trace, s.start, s.n")
    for trace, trace_rows in groupby(rows, key=lambda row: row[0]):
        if trace in big:  # its rows are passed by unread
            yield _over(f"trace {trace}", big[trace], limit)
            continue
        try:
            yield from _runs([_span(payload) for _, payload in trace_rows], counts)
        except SpanError as exc:
            yield exc
    # model calls alone, in the order they started
    grouped = selection.unit == "auto"
    for (payload,) in spool.query(f"SELECT span FROM spans WHERE {lone} AND (conv IS NULL OR ?) ORDER BY start, n",
                                  int(not grouped)):
        yield from _one(_span(payload), "span", counts)
    # conversations, each on its last call, with every turn
    if grouped:
        big = _too_many(spool, "conv", f"{lone} AND conv IS NOT NULL", limit)
        rows = spool.query(f"SELECT conv, span FROM spans WHERE {lone} AND conv IS NOT NULL ORDER BY conv, start, n")
        for conv, conv_rows in groupby(rows, key=lambda row: row[0]):
            if conv in big:
                yield _over(f"conversation {conv}", big[conv], limit)
                continue
            calls = [_span(payload) for _, payload in conv_rows]
            try:
                history = genai.conversation_messages(calls)
            except SpanError as exc:
                yield exc
                continue
            yield from _one(max(calls, key=lambda c: (c.end, c.start)), "conversation", counts, history)


def _one(span: Span, unit: str, counts: SpanCounts, history: list[dict] | None = None) -> Iterator[dict | SpanError]:
    try:
        inst = genai.chat_instance(span)
    except SpanError as exc:
        yield exc
        return
    if inst is None:
        counts.chat_without_text += 1
        return
    if unit == "conversation":
        inst["messages"] = history
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


def load_traces(spec: DatasetSpec, checker: InstanceChecker, add_problem: Callable[[str, str], None],
                 max_problems: int, roots: list[Path] | None = None) -> LoadedDataset:
    """The job's instances from OTLP trace exports: checked, spooled and reported as any dataset's
    records are (``evalq.shared.data.instances.load_dataset``). ``roots``: a queue request's, which
    every file read must lie under, links followed."""
    spool, bad, counts, n_problems = SpooledInstances(), BadRecords(), SpanCounts(), 0
    for item in instances(spec.uri, spec.endpoint_url, spec.traces, counts, roots):  # instances, or located errors
        if isinstance(item, dict):
            where, problems = f"{spec.uri} span {item['id']} (trace {item['otel']['trace_id']})", checker.check(item)
        else:  # a line or span that cannot be read: its place, and what is wrong
            where, _, problem = str(item).partition(": ")
            problems = [problem or where]
        if not problems:
            spool.append(item)
        elif (n_problems := said(spec, bad, add_problem, where, problems, n_problems, max_problems)) < 0:
            break
    if not len(spool) and not n_problems:
        add_problem(spec.uri, f"no GenAI spans to score ({counts.describe()})")
    return LoadedDataset(spool, array("q", range(1, len(spool) + 1)), bad, counts.describe(), counts.as_json())
