"""A run's item records: one immutable Parquet part per chunk in the job store, or a Redis hash.

A job staged in the store (its stored document's ``records`` is ``parts``) keeps its item records there too: a
chunk writes every record it holds as ``records/entry=<run key>/chunk-<start>.parquet`` in the job's
folder, whole, before its Redis transaction; a redelivered chunk writes the same name again, so
nothing is counted twice. Redis keeps only how many records each chunk wrote
(``keys.recorded``, chunk start -> count) and their sum (``keys.recorded_total``), set in the
chunk's transaction by a script that replaces the chunk's count, so progress, ``evalq status`` and
the sweeper read one number, whatever the job's size. A job without a store keeps its records in
``res:{M}`` as before (and the same counts).

The two are one interface (``RedisRecords``, ``PartRecords``: write a chunk, read records by
position or all of them, each chunk's report view and history values), chosen once from the
job's stored document (``evalq.shared.job.stored.StoredJob.records``, through ``records_of``: a
place and each run's chunk size, never the document) and carried by the job: no caller asks which
it has.

Parts have the columns ``position`` (int64, the instance's place in the job), ``instance_id``,
``category``, ``outcome`` (scored, error, skipped or not_applicable) and ``record`` (the item's
record as the log line carries it, JSON). A chunk's positions are ``[start, start + chunk_size)``
of its run (``evalq.shared.cluster.spec``), so any position's part is known without a lookup.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
import zlib
from collections import OrderedDict
from typing import Any, Iterable, Iterator

from evalq.shared.cluster import journal, keys
from evalq.shared.core.jsonio import encode
from evalq.shared.scores.results import outcome
from evalq.shared.store.part_meta import (ACCOUNT_KEY, PART_KEY, TIME_KEY, VALUES_KEY,  # noqa: F401
                                          VIEW_KEY, part_name, unpacked)  # (importable here too)
from evalq.shared.store.columns import typed  # (what a record's typed columns hold; importable here too)
from evalq.shared.store.groups import (Grouping, mark, marked, pending_name, pending_parts, write_group,
                                       write_when_whole)
from evalq.shared.store.place import Place

PARTS = "parts"  # the stored document's ``records`` where they are parts

# the chunk's count replaced, the total moved by the difference: a chunk written again changes nothing
_COUNT = """
local old = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return redis.call('INCRBY', KEYS[2], tonumber(ARGV[2]) - old)
"""



def records_of(job_id: str, staged: dict | None, runs: dict[str, tuple[int, int | None, int]]
               ) -> "RedisRecords | PartRecords":
    """The job's records: parts beside its instances where the store holds them (``staged``: where,
    as the stored job keeps it; ``runs``: each run's chunk size, part size (None: a part per chunk)
    and span), else Redis. Chosen once, by the stored job: no caller asks which."""
    if staged:
        return PartRecords(job_id, Place.from_json(staged), runs)
    return RedisRecords(job_id)


class RedisRecords:
    """A job's item records in Redis: ``res:{M}`` by position, each chunk's history values and report
    view in hashes of their own."""

    def __init__(self, job_id: str):
        self.job_id = job_id

    def write(self, pipe: Any, key: str, start: int, new: dict[int, dict], whole: list[tuple[int, dict]] | None,
              values: dict | None = None, view: dict | None = None, part: dict | None = None,
              elapsed: dict | None = None, acct: dict | None = None, ttl: int = 0) -> None:
        """Queue on ``pipe`` (the chunk's MULTI transaction) the records this run made (``new``), the
        chunk's ``values`` (what the history store needs of it) and ``view`` (what the report needs),
        and, once the chunk has ended (``whole``: every record it holds), its count."""
        if new:  # HSET by instance position: a redelivered chunk overwrites, it never adds
            pipe.hset(keys.results(self.job_id, key), mapping={str(p): encode(rec) for p, rec in new.items()})
        _side_hashes(pipe, self.job_id, key, start, values, view)
        if whole is not None:
            _count_ops(pipe, self.job_id, key, start, len(whole))

    def landed(self, r: Any, key: str, start: int) -> None:
        """After the chunk's transaction: nothing more (its records are in ``res:{M}``)."""

    def get_many(self, r: Any, key: str, positions: list[int], complete: bool = False) -> list:
        """The stored records (JSON, bytes) at ``positions``, None where none was written."""
        return r.hmget(keys.results(self.job_id, key), [str(p) for p in positions]) if positions else []

    def get_many_beside(self, r: Any, key: str, positions: list[int], other: str) -> tuple[list, list]:
        """``get_many`` and the same positions of hash ``other`` (what was kept of the items), in one
        round trip."""
        fields = [str(p) for p in positions]
        pipe = r.pipeline(transaction=False)
        pipe.hmget(keys.results(self.job_id, key), fields)
        pipe.hmget(other, fields)
        recorded, kept = pipe.execute()
        return recorded, kept

    def scan(self, r: Any, key: str) -> Iterator[tuple[int, Any]]:
        """(position, record JSON) of every record of the run, in no order."""
        for position, raw in r.hscan_iter(keys.results(self.job_id, key), count=5000):
            yield int(position), raw

    def views(self, r: Any, key: str) -> Iterator[bytes | None]:
        """Each chunk's report view (JSON), in start order."""
        raw = r.hgetall(keys.views(self.job_id, key))
        for k in sorted(raw, key=int):
            yield raw[k]

    def values(self, r: Any, key: str) -> Iterator[tuple[int, bytes | None]]:
        """(start, history values JSON) of each chunk that left them, in start order."""
        kept = r.hgetall(keys.values(self.job_id, key))
        yield from sorted(((int(start), raw) for start, raw in kept.items()), key=lambda item: item[0])

    def read_step(self, key: str, default: int) -> int:
        """How many positions a reader of every record takes at a time."""
        return default

    def accounting(self, key: str, start: int, counts: dict[str, int], landed: bool, r: Any = None) -> None:
        return None  # Redis holds the job's accounting; nothing rebuilds it

    def holding(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


class PartRecords:
    """A job's item records as one immutable Parquet part per chunk in its job store folder
    (``place``), or per group of chunks (``evalq.shared.store.groups``: a judge entry planned in
    small chunks); ``runs``: each run's chunk size (a chunk's positions are ``[start, start + size)``),
    part size and span."""

    def __init__(self, job_id: str, place: Place, runs: dict[str, tuple[int, int | None, int]]):
        self.job_id, self.place = job_id, place
        self.sizes = {key: chunk for key, (chunk, _, _) in runs.items()}
        self.groups = {key: Grouping(chunk, part, n) for key, (chunk, part, n) in runs.items() if part and part > chunk}
        self._written: set[tuple[str, int]] = set()  # (run, group) whose part this process saw written
        self._held: OrderedDict[str, bytes] | None = None  # parts read while ``holding``
        self._held_bytes = 0

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """While in it, each part read is kept (up to ``EVALQ_PART_CACHE_BYTES``, default 256 MiB,
        least recently read first out): the final callback reads a run's parts for the report's
        views, the log and the history's values, and each from the store once (issue 73). Parts
        do not change once their run has ended; those of a run still going are not read here."""
        self._held, self._held_bytes = OrderedDict(), 0
        try:
            yield
        finally:
            self._held, self._held_bytes = None, 0

    def _get(self, name: str) -> bytes | None:
        held = self._held
        if held is None:
            return self.place.get(name, missing_ok=True)
        if name in held:
            held.move_to_end(name)
            return held[name]
        data = self.place.get(name, missing_ok=True)
        if data is not None and len(data) <= HOLD_BYTES():
            held[name] = data
            self._held_bytes += len(data)
            while self._held_bytes > HOLD_BYTES() and len(held) > 1:
                _, dropped = held.popitem(last=False)
                self._held_bytes -= len(dropped)
        return data

    def locations(self) -> dict:
        """Its folder, and a glob per part kind and run (``evalq results``)."""
        folder = self.place.uri.rstrip("/")
        return {"store": folder, "instances": f"{folder}/instances/part-*.parquet",
                "records": {key: f"{folder}/{part_name(key, 0).rsplit('/', 1)[0]}/chunk-*.parquet"
                            for key in self.sizes}}

    def write(self, pipe: Any, key: str, start: int, new: dict[int, dict], whole: list[tuple[int, dict]] | None,
              values: dict | None = None, view: dict | None = None, part: dict | None = None,
              elapsed: dict | None = None, acct: dict | None = None, ttl: int = 0) -> None:
        """In this order: the chunk's part (every record it holds, ``whole``, with its ``values`` and
        ``view`` in the part's metadata) is written to the store now, whole; its count is queued on
        ``pipe``, the chunk's transaction, which the caller executes after. So a count never stands
        for a part that is not there, and a chunk written again (redelivered) writes the same name
        and replaces its count: nothing is counted twice. ``whole`` None (the chunk has not ended):
        no part, no count; what it has of values and view waits in Redis. A run whose parts group
        chunks writes the chunk's part as pending instead (``landed`` writes the group's part)."""
        # and its aggregate and time, so that the store alone gives back what Redis held of the chunk
        # (evalq.orchestrator.rebuild, after Redis lost the job)
        meta = {VALUES_KEY: values, VIEW_KEY: view, PART_KEY: part, TIME_KEY: elapsed, ACCOUNT_KEY: acct}
        grouping = self.groups.get(key)
        if grouping is not None and whole is not None:
            if (key, grouping.first(start)) not in self._written:  # (a run again after it: in the part)
                self.place.put(pending_name(key, start), _encode(whole, meta))
                mark(pipe, self.job_id, key, start, ttl)
            _count_ops(pipe, self.job_id, key, start, len(whole))
            return
        if whole:
            self.place.put(part_name(key, start), _encode(whole, meta))
            journal.note("part", self.job_id, journal.chunk_id(key, start), n=len(whole))
        elif whole is None:
            _side_hashes(pipe, self.job_id, key, start, values, view)
        if whole is not None:
            _count_ops(pipe, self.job_id, key, start, len(whole))

    def landed(self, r: Any, key: str, start: int) -> None:
        """After the chunk's transaction: where its run groups chunks and its group is whole now, the
        group's part is written (``evalq.shared.store.groups``)."""
        grouping = self.groups.get(key)
        if grouping is not None and (key, grouping.first(start)) not in self._written:
            if write_when_whole(r, self.job_id, key, grouping, start, lambda first, starts: write_group(
                    self.place, self.job_id, key, first, starts, _encode, _decode)):
                self._written.add((key, grouping.first(start)))

    def _group(self, key: str, first: int, starts: list[int]) -> dict[int, str]:
        """A group's records by position: its part's, or (not written yet) those of its chunks at
        ``starts`` from their pending parts."""
        data = self._get(part_name(key, first))
        if data is not None:
            self._written.add((key, first))
            return _decode(data)
        return {p: record for records, _ in pending_parts(self.place, key, starts, _decode).values()
                for p, record in records.items()}

    def get_many(self, r: Any, key: str, positions: list[int], complete: bool = False) -> list:
        """``complete``: the run has ended (its parts will not change), so parts may come from this
        process's cache (the generation stage's outputs, read by every metric chunk)."""
        if not positions:
            return []
        size, chunk = self.read_step(key, 0), self.sizes[key]
        found: dict[int, str] = {}
        for start in sorted({p - p % size for p in positions}):
            if key in self.groups:  # (the pending parts of its chunks of ``positions`` that Redis marks)
                found.update(self._group(key, start, marked(r, self.job_id, key, sorted(
                    {p - p % chunk for p in positions if start <= p < start + size}))))
            else:
                found.update(_read_part(self.place, key, start, cached=complete, get=self._get))
        return [found.get(p) for p in positions]

    def get_many_beside(self, r: Any, key: str, positions: list[int], other: str) -> tuple[list, list]:
        return self.get_many(r, key, positions), r.hmget(other, [str(p) for p in positions])

    def scan(self, r: Any, key: str) -> Iterator[tuple[int, Any]]:
        """(position, record JSON) of every record of the run: a part at a time, in chunk order."""
        grouping = self.groups.get(key)
        if grouping is not None:
            for first, members in grouping.by_group(self._starts(r, key)):
                yield from sorted(self._group(key, first, members).items())
            return
        for start in self._starts(r, key):
            yield from sorted(_read_part(self.place, key, start, get=self._get).items())

    def views(self, r: Any, key: str) -> Iterator[bytes | None]:
        for _, raw in self._meta(r, key, VIEW_KEY):
            yield raw

    def values(self, r: Any, key: str) -> Iterator[tuple[int, bytes | None]]:
        return self._meta(r, key, VALUES_KEY)

    def read_step(self, key: str, default: int) -> int:
        grouping = self.groups.get(key)  # a part at a time: each read once
        return grouping.part if grouping is not None else self.sizes[key]

    def accounting(self, key: str, start: int, counts: dict[str, int], landed: bool, r: Any = None) -> dict:
        """What a chunk's part carries of its calls' accounting: ``counts`` (this run's and the runs'
        before it that did not land), plus, where the chunk had landed before (``landed``: a part is
        there), that part's."""
        if landed:
            import pyarrow as pa
            import pyarrow.parquet as pq

            grouping = self.groups.get(key)
            first = grouping.first(start) if grouping is not None else start
            tail = self.place.get(part_name(key, first), missing_ok=True, last=FOOTER_BYTES)
            if tail is None and grouping is not None:  # its group's part not written yet: its pending part
                tail, grouping = self.place.get(pending_name(key, start), missing_ok=True, last=FOOTER_BYTES), None
            if tail is not None:  # (a group's part: by chunk)
                earlier = unpacked(pq.read_metadata(pa.BufferReader(tail)).metadata, ACCOUNT_KEY) or {}
                earlier = (earlier.get(str(start)) or {}) if grouping is not None else earlier
                counts = summed([counts, earlier.get("counts")])
        return {"counts": counts}

    def _starts(self, r: Any, key: str) -> list[int]:
        return sorted(int(s) for s in r.hkeys(keys.recorded(self.job_id, key)))

    def _meta(self, r: Any, key: str, name: bytes) -> Iterator[tuple[int, bytes | None]]:
        """(chunk start, what its part carries under ``name``, or None) of every chunk recorded so
        far, in start order, a part at a time."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        grouping = self.groups.get(key)
        if grouping is not None:
            yield from self._group_meta(r, key, name, grouping)
            return
        for start in self._starts(r, key):
            data = self._get(part_name(key, start))
            meta = pq.read_schema(pa.BufferReader(data)).metadata if data is not None else None
            packed = (meta or {}).get(name)
            yield start, zlib.decompress(packed) if packed is not None else None

    def _group_meta(self, r: Any, key: str, name: bytes, grouping: Grouping) -> Iterator[tuple[int, bytes | None]]:
        """``_meta`` of a run whose parts group chunks: each chunk's, from its group's part (or from
        what it gathered, its group's part not written yet)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        for first, members in grouping.by_group(self._starts(r, key)):
            data = self._get(part_name(key, first))
            if data is not None:
                by_chunk = unpacked(pq.read_schema(pa.BufferReader(data)).metadata, name) or {}
                values = {s: by_chunk.get(str(s)) for s in members}
            else:
                pending = pending_parts(self.place, key, members, _decode)
                values = {s: pending[s][1].get(name) if s in pending else None for s in members}
            for s in members:
                yield s, encode(values[s]).encode("utf-8") if values[s] is not None else None


def _side_hashes(pipe: Any, job_id: str, key: str, start: int, values: dict | None, view: dict | None) -> None:
    if view is not None:
        pipe.hset(keys.views(job_id, key), str(start), encode(view))
    if values is not None:
        pipe.hset(keys.values(job_id, key), str(start), encode(values))


def _count_ops(pipe: Any, job_id: str, key: str, start: int, n: int) -> None:
    pipe.eval(_COUNT, 2, keys.recorded(job_id, key), keys.recorded_total(job_id, key), start, n)


def count(r: Any, job_id: str, key: str) -> int:
    """How many records the run's chunks wrote (either backend keeps the same count in Redis)."""
    return int(r.get(keys.recorded_total(job_id, key)) or 0)


_CACHE: "OrderedDict[tuple[str, str], dict[int, str]]" = OrderedDict()
_CACHED = 64  # parts of ended runs a process keeps (a generation stage's chunks are small)
_LOCK = threading.Lock()


def _read_part(place: Place, key: str, start: int, cached: bool = False, get=None) -> dict[int, str]:
    """The chunk's records by position ({} where the chunk wrote no part); ``get``: how a part's bytes
    are read (``PartRecords._get``), else from ``place``."""
    name = part_name(key, start)
    if cached:
        with _LOCK:
            hit = _CACHE.get((place.uri, name))
            if hit is not None:
                _CACHE.move_to_end((place.uri, name))
                return hit
    data = get(name) if get is not None else place.get(name, missing_ok=True)
    records = _decode(data) if data is not None else {}
    if cached and data is not None:
        with _LOCK:
            _CACHE[(place.uri, name)] = records
            while len(_CACHE) > _CACHED:
                _CACHE.popitem(last=False)
    return records





def HOLD_BYTES() -> int:  # noqa: N802  (read when used: a test, an operator may set it)
    """What ``PartRecords.holding`` keeps of parts read, at most (``EVALQ_PART_CACHE_BYTES``)."""
    try:
        return int(os.environ.get("EVALQ_PART_CACHE_BYTES", 256 << 20))
    except ValueError:
        return 256 << 20


FOOTER_BYTES = 1 << 16  # a record part's footer (its schema and row groups) is a few kB: read alone


def summed(counted: Iterable[dict | None]) -> dict[str, int]:
    """Accounting counts (``ACCOUNT_KEY``'s, ``keys.accounting``'s fields) added up."""
    total: dict[str, int] = {}
    for counts in counted:
        for name, value in (counts or {}).items():
            total[name] = total.get(name, 0) + int(value)
    return total


def _encode(records: Iterable[tuple[int, dict]], meta: dict[bytes, dict | None] | None = None) -> bytes:
    import pyarrow.parquet as pq

    from evalq.shared.store.columns import bools, float64s, int64s, strings, table as make_table

    rows = list(records)
    kinds = [typed(rec) for _, rec in rows]
    table = make_table({
        "position": int64s(p for p, _ in rows),
        "instance_id": strings([str(rec.get("instance_id")) for _, rec in rows]),
        "category": strings([rec.get("category") if isinstance(rec.get("category"), str) else None
                             for _, rec in rows]),
        "outcome": strings([outcome(rec) for _, rec in rows]),  # as results.json counts it
        # what most queries read, typed (``typed``): no json_extract and cast for them
        "score": float64s(score for score, _, _ in kinds),
        "label": strings([label for _, label, _ in kinds]),
        "passed": bools(passed for _, _, passed in kinds),
        "error": strings([rec.get("error") if isinstance(rec.get("error"), str) else None for _, rec in rows]),
        "record": strings([encode(rec) for _, rec in rows]),
    })
    kept = {name: value for name, value in (meta or {}).items() if value is not None}
    if kept:  # Parquet keeps metadata uncompressed: what rides there is zlib'd
        table = table.replace_schema_metadata({name: zlib.compress(encode(value).encode("utf-8"), 6)
                                               for name, value in kept.items()})
    out = io.BytesIO()
    pq.write_table(table, out, compression="zstd")
    return out.getvalue()


def _decode(data: bytes) -> dict[int, str]:
    from evalq.shared.store.columns import read

    table = read(data, ["position", "record"])
    return dict(zip(table.column("position").to_pylist(), table.column("record").to_pylist()))


def locations(records: "RedisRecords | PartRecords") -> dict:
    """Where a job's parts are (``evalq results``): its folder, and a glob per part kind and run."""
    if not isinstance(records, PartRecords):
        return {"store": None}
    return records.locations()
