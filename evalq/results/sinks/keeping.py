"""The keeping every sink shares: each item's scores written once, and nothing lost in silence.

A chunk's items go to each of the job's sinks once its records are written (``export_items``). The
positions a sink took are marked in Redis (``keys.exported``) only after it accepted them, so a chunk
run again (a worker died, the message came back) sends only what was not marked; an item with nothing
for the sink (an error, no span or trace to attach to) is marked too, and counted apart
(``keys.sink_none``). A sink whose writes are not replaced by a second one (MLflow's assessments:
``Sink.idempotent`` False) has its positions claimed before the request (``keys.sink_pending``): a
position another process holds a live claim on is left to it (the same chunk run twice at once, a
message delivered again while its first run still sends: the final callback waits for such claims
to end), and one claimed before but not marked (a process died after sending, before marking) may
have been taken, so the backend is asked what it already has before it is sent again.

A request that fails is counted (``refused``, with the backend's answer) and its items left
unmarked, and that process sends nothing to that sink for ``PAUSE`` seconds (a backend that is down
would otherwise cost every chunk a timeout); the final callback sends what is left (``export_rest``)
and counts what even it could not as ``unsent``. A backend that says it can take none at all (a 404
or 405 at its path, a refused schema, a refused credential: ``Refused.cannot``) is found on the first
request and never asked again for the job.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import time
from dataclasses import dataclass, field
from functools import lru_cache

import redis

from evalq.shared.cluster import keys, telemetry
from evalq.shared.job.stored import as_stored
from evalq.shared.store import records as stored_records
from evalq.shared.traces.events import Evaluation, evaluations

log = logging.getLogger("evalq.sinks")
BATCH = 512  # evaluations per request, where the backend takes many at once
# After a failed request a process leaves that sink alone this long: a sink's retries and timeouts
# would otherwise be added to every chunk while it is down.
PAUSE = 60.0
_DOWN: dict[str, float] = {}
RETRIES = 3  # failed requests the final callback rides out before it gives the rest up
REST_BATCH = 1000  # records the final callback reads at a time, whatever N is
HTTP_TIMEOUT = 30.0  # seconds per request to a REST sink (Phoenix, MLflow)
CLAIM_SECONDS = 300.0  # how long a claim on positions holds them: a batch's sends, timeouts included

# KEYS: claims; ARGV: seconds, ttl, who, positions. Returns {fresh, maybe (claimed before), busy}.
CLAIM_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local mine = tostring(now + tonumber(ARGV[1])) .. ':' .. ARGV[3]
local fresh, maybe, busy = {}, {}, {}
for i = 4, #ARGV do
  local p = ARGV[i]
  local v = redis.call('HGET', KEYS[1], p)
  local lapses = v and tonumber(string.match(v, '^[^:]+')) or nil
  if lapses and lapses > now then
    busy[#busy + 1] = p
  else
    if v then maybe[#maybe + 1] = p else fresh[#fresh + 1] = p end
    redis.call('HSET', KEYS[1], p, mine)
  end
end
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
return {fresh, maybe, busy}
"""
# KEYS: claims; ARGV: who, positions: given back where this process still holds them.
UNCLAIM_LUA = """
for i = 2, #ARGV do
  local v = redis.call('HGET', KEYS[1], ARGV[i])
  if v and string.match(v, ':(.*)$') == ARGV[1] then redis.call('HSET', KEYS[1], ARGV[i], '0') end
end
return 1
"""


_TRACE_ID, _SPAN_ID = re.compile(r"[0-9a-f]{32}"), re.compile(r"[0-9a-f]{16}")


class Refused(Exception):
    """A request the sink did not take. ``cannot``: it takes no scores at all (found on the first
    request, never asked again); ``taken``: positions it took before it stopped; ``unreachable``: no
    backend answered (a connection refused or timed out, a client library missing), counted apart
    from what a backend refused."""

    def __init__(self, answer: str, cannot: bool = False, taken: set[int] | None = None,
                 unreachable: bool = False):
        super().__init__(answer)
        self.answer, self.cannot, self.taken, self.unreachable = answer, cannot, taken or set(), unreachable


@dataclass
class Sink:
    """Where a job's scores go. ``name`` is what run.json and results.json count it under (``otlp``,
    or the operator's name in ``EVALQ_SINKS``); ``endpoint`` is shown (no credentials in it)."""

    name: str
    kind: str
    endpoint: str
    idempotent: bool = True  # a second write of the same evaluation replaces the first
    needs: str | None = None  # what an evaluation must carry to be sent: "span", "trace", or nothing
    batch: int = BATCH
    extra: dict = field(default_factory=dict)

    def takes(self, ev: Evaluation) -> bool:
        """Whether ``ev`` carries what this sink writes onto: ids as OTLP has them (lower-case hex of
        16 and 8 bytes, as evalq's trace reader makes them), never text that could leave the sink's
        API path (a trace id is a path segment of MLflow's)."""
        if self.needs == "span":
            return bool(_SPAN_ID.fullmatch(ev.span_id or "") and _TRACE_ID.fullmatch(ev.trace_id or ""))
        if self.needs == "trace":
            return bool(_TRACE_ID.fullmatch(ev.trace_id or ""))
        return True

    def send(self, job_id: str, entry_key: str, entry: dict, events: list[tuple[int, Evaluation]]) -> dict[int, str]:
        """Write ``events`` (position, evaluation); returns the positions the backend refused one by
        one (a span it does not have: they stay unsent, and are tried again at the end), with its
        answer. Raises ``Refused`` when it took none (or stopped part way: ``taken``)."""
        raise NotImplementedError

    def already(self, job_id: str, events: list[tuple[int, Evaluation]]) -> set[str]:
        """The event ids among ``events`` the backend already holds (asked only of a sink whose
        writes are not idempotent, for positions a dead process may have sent)."""
        return set()


@lru_cache(maxsize=16)
def http_client(name: str, base: str):
    """One keep-alive HTTP client per REST sink and process, with the operator's headers for it."""
    import httpx

    from evalq.shared.core.config import sink_headers

    return httpx.Client(base_url=base, headers=sink_headers(name), timeout=HTTP_TIMEOUT)


def judged(entry: dict) -> bool:
    """Whether a judge scores the entry (an LLM's evaluation) rather than evalq's code."""
    from evalq.shared.metrics.registry import REGISTRY

    return entry["id"] in REGISTRY and REGISTRY.get(entry["id"]).queue == "judge"


def _refused(r: redis.Redis, job_id: str, spec: dict, sink: Sink, entry_key: str, n: int, answer: str,
             cannot: bool, unreachable: bool = False) -> None:
    """Count ``n`` evaluations the sink did not take: ``refused`` by its backend, or ``unreachable``
    (no backend answered)."""
    outcome = "unreachable" if unreachable else "refused"
    pipe = r.pipeline(transaction=False)
    pipe.hincrby(keys.sink(job_id, sink.name), outcome, n)
    pipe.hincrby(keys.sink(job_id, sink.name), f"{outcome}:{entry_key}", n)
    pipe.hset(keys.sink(job_id, sink.name), mapping={"answer": answer[:500], **({"cannot": 1} if cannot else {})})
    pipe.expire(keys.sink(job_id, sink.name), as_stored(spec).ttl)
    pipe.execute()
    telemetry.scores_exported(sink.name, outcome, n)


def _mark(r: redis.Redis, job_id: str, spec: dict, sink: Sink, entry_key: str, took: list[int],
          nothing: list[int]) -> None:
    pipe = r.pipeline(transaction=False)
    for key, positions in ((keys.exported(job_id, entry_key, sink.name), took + nothing),
                           (keys.sink_none(job_id, entry_key, sink.name), nothing)):
        if positions:
            pipe.sadd(key, *(str(p) for p in positions))
            pipe.expire(key, as_stored(spec).ttl)
    pipe.execute()


def cannot(r: redis.Redis, job_id: str, sink: Sink) -> bool:
    return bool(r.hexists(keys.sink(job_id, sink.name), "cannot"))


def try_again(r: redis.Redis, job_id: str, sink: Sink) -> None:
    """Forget that ``sink`` took none of the job's scores, or was away (``evalq resend``: the operator
    mended it): the next send asks it again. What it took stays marked, so nothing goes twice."""
    r.hdel(keys.sink(job_id, sink.name), "cannot", "answer")
    _DOWN.pop(sink.name, None)


def export_items(r: redis.Redis, sink: Sink, job_id: str, spec: dict, entry_key: str, entry: dict, kind: str,
                 items: list[tuple[int, dict]], force: bool = False) -> int:
    """Send the evaluations of ``items`` (position, record) the sink has not taken; returns how many
    it took. Never raises for the sink's sake: the items are kept, and the final callback tries
    again."""
    if not items or (not force and time.monotonic() < _DOWN.get(sink.name, 0.0)) or cannot(r, job_id, sink):
        return 0  # nothing, a sink that just failed (the final callback sends these), or one that takes none
    done = r.smismember(keys.exported(job_id, entry_key, sink.name), [str(p) for p, _ in items])
    todo = [(p, rec) for (p, rec), marked in zip(items, done) if not marked]
    name = entry.get("name") or entry["id"]
    sent = 0
    for lo in range(0, len(todo), sink.batch):
        part = todo[lo:lo + sink.batch]
        events = [(p, ev) for p, rec in part
                  for ev in evaluations(job_id, entry_key, name, kind, entry.get("parameters"), p, rec, rec.get("otel"))
                  if sink.takes(ev)]
        having = {p for p, _ in events}
        nothing = [p for p, _ in part if p not in having]
        refused: dict[int, str] = {}
        busy: set[int] = set()
        claim = None
        if events:
            try:
                if not sink.idempotent:
                    claim = _Claim(r, job_id, spec, entry_key, sink)
                    events, busy = claim.take(events)
                refused = sink.send(job_id, entry_key, entry, events) if events else {}
            except Exception as exc:  # the sink's own failure: what it did not take stays unmarked
                # not an answer of the backend's (a connection refused, a timeout, a client missing): unreachable
                no = exc if isinstance(exc, Refused) else Refused(f"{type(exc).__name__}: {exc}", unreachable=True)
                taken = sorted(no.taken)
                _mark(r, job_id, spec, sink, entry_key, taken, [])
                if claim is not None:  # what it took is marked; the rest may be claimed (looked up) at once
                    claim.give_back(having - busy)
                n_left = sum(1 for p, _ in events if p not in no.taken)
                log.warning("job %s %s: %s did not take %d evaluations (%s); %s", job_id, entry_key, sink.name,
                            n_left, no.answer, "it takes none: not asked again for the job" if no.cannot
                            else f"this process sends it none for {PAUSE:.0f} s")
                _DOWN[sink.name] = time.monotonic() + PAUSE
                _refused(r, job_id, spec, sink, entry_key, n_left, no.answer, no.cannot, no.unreachable)
                return sent + sum(1 for p, _ in events if p in no.taken)
        took = sorted(having - set(refused) - busy)  # a position another process holds is its to mark
        _mark(r, job_id, spec, sink, entry_key, took, nothing)
        if claim is not None:  # marked, or refused: nothing of this process's is in flight any more
            claim.give_back(having - busy)
        n_took = sum(1 for p, _ in events if p not in refused)
        sent += n_took
        telemetry.scores_exported(sink.name, "sent", n_took)
        if refused:
            answer = next(iter(refused.values()))
            log.warning("job %s %s: %s refused %d items (%s); tried again at the job's end", job_id, entry_key,
                        sink.name, len(refused), answer)
            _refused(r, job_id, spec, sink, entry_key, sum(1 for p, _ in events if p in refused), answer, False)
    return sent


class _Claim:
    """This process's claim on positions of a sink that keeps every write (``keys.sink_pending``)."""

    def __init__(self, r: redis.Redis, job_id: str, spec: dict, entry_key: str, sink: Sink):
        import secrets

        self.r, self.job_id, self.sink, self.ttl = r, job_id, sink, as_stored(spec).ttl
        self.key = keys.sink_pending(job_id, entry_key, sink.name)
        self.who = secrets.token_hex(6)

    def take(self, events: list[tuple[int, Evaluation]]) -> tuple[list[tuple[int, Evaluation]], set[int]]:
        """The events to send now, and the positions another process is sending (left to it): of the
        positions claimed before, those the backend already has are left out."""
        positions = sorted({p for p, _ in events})
        _, maybe, busy = self.r.eval(CLAIM_LUA, 1, self.key, CLAIM_SECONDS, self.ttl, self.who, *positions)
        maybe, busy = {int(p) for p in maybe}, {int(p) for p in busy}
        events = [(p, ev) for p, ev in events if p not in busy]
        if maybe:
            have = self.sink.already(self.job_id, [(p, ev) for p, ev in events if p in maybe])
            events = [(p, ev) for p, ev in events if ev.event_id not in have]
        return events, busy

    def give_back(self, positions: set[int]) -> None:
        """Positions this process sent and the backend did not take: claimable at once (looked up first)."""
        if positions:
            self.r.eval(UNCLAIM_LUA, 1, self.key, self.who, *sorted(positions))


def _wait_for_claims(r: redis.Redis, job_id: str, entry_key: str, sink: Sink) -> None:
    """At the job's end, for a sink that keeps every write: until no other process holds a live claim
    on the entry's positions (a chunk's second run still sending), or ``CLAIM_SECONDS`` have passed."""
    key = keys.sink_pending(job_id, entry_key, sink.name)
    deadline = time.monotonic() + CLAIM_SECONDS
    while time.monotonic() < deadline:
        seconds, micro = r.time()
        now = seconds + micro / 1e6
        live = [p for p, v in r.hgetall(key).items() if v != b"0" and float(v.split(b":")[0]) > now]
        if not live or all(r.smismember(keys.exported(job_id, entry_key, sink.name), live)):
            return
        time.sleep(0.2)


def export_rest(r: redis.Redis, sink: Sink, job_id: str, spec: dict) -> dict:
    """At the job's end (the final callback): send what no chunk could, entry by entry, a thousand
    records at a time, unless the sink said it takes none. Returns what it got, for run.json and
    results.json: per entry the items it took (``sent``), those with nothing for it (``skipped``)
    and those it did not take (``unsent``), the evaluations it refused on the way (``refused``, each
    request's that failed: an item refused and then taken counts in both) and those no backend
    answered for (``unreachable``); its last answer."""
    from evalq.shared.cluster.spec import METRICS_STAGE, stage_runs
    from evalq.shared.metrics.registry import REGISTRY

    failures, entries = 0, {}
    for key, entry in stage_runs(spec, METRICS_STAGE):
        if entry["id"] not in REGISTRY:
            continue
        if not sink.idempotent:
            _wait_for_claims(r, job_id, key, sink)
        if r.scard(keys.exported(job_id, key, sink.name)) >= stored_records.count(r, job_id, key):
            left = iter(())  # every record handled as its chunk ended (the usual night): no part read again
        else:
            marked = {int(p) for p in r.smembers(keys.exported(job_id, key, sink.name))}
            left = (item for item in as_stored(spec, job_id).records.scan(r, key) if item[0] not in marked)
        while not cannot(r, job_id, sink):
            batch = list(itertools.islice(left, REST_BATCH))
            if not batch:
                break
            items = [(p, json.loads(raw)) for p, raw in batch]
            while failures < RETRIES:  # the last chance: a few tries, then the rest is counted as unsent
                before = _DOWN.get(sink.name, 0.0)
                export_items(r, sink, job_id, spec, key, entry, REGISTRY.get(entry["id"]).aggregation, items,
                             force=True)
                if _DOWN.get(sink.name, 0.0) == before or cannot(r, job_id, sink):
                    break
                failures += 1
                time.sleep(min(2.0 ** failures, 8.0))
        handled = r.scard(keys.exported(job_id, key, sink.name))
        skipped = r.scard(keys.sink_none(job_id, key, sink.name))
        unsent = max(0, stored_records.count(r, job_id, key) - handled)
        refused, unreachable = (int(v or 0) for v in r.hmget(keys.sink(job_id, sink.name), f"refused:{key}",
                                                              f"unreachable:{key}"))
        entries[key] = {"sent": handled - skipped, "unsent": unsent, **({"skipped": skipped} if skipped else {}),
                        **({"refused": refused} if refused else {}),
                        **({"unreachable": unreachable} if unreachable else {})}
        if unsent:
            log.warning("job %s %s: %d items' scores were not sent to %s", job_id, key, unsent, sink.name)
    said = r.hgetall(keys.sink(job_id, sink.name))
    return {"kind": sink.kind, "endpoint": sink.endpoint, "entries": entries,
            "refused_events": int(said.get(b"refused", 0)),
            "unreachable_events": int(said.get(b"unreachable", 0)),
            "answer": said[b"answer"].decode() if b"answer" in said else None}
