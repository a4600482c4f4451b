"""A run's item records: one immutable Parquet part per chunk in the job store, or a Redis hash.

A job staged in the store (``spec["records"] == "parts"``) keeps its item records there too: a
chunk writes every record it holds as ``records/entry=<run key>/chunk-<start>.parquet`` in the job's
folder, whole, before its Redis transaction; a redelivered chunk writes the same name again, so
nothing is counted twice. Redis keeps only how many records each chunk wrote
(``keys.recorded``, chunk start -> count) and their sum (``keys.recorded_total``), set in the
chunk's transaction by a script that replaces the chunk's count, so progress, ``evalq status`` and
the sweeper read one number, whatever the job's size. A job without a store keeps its records in
``res:{M}`` as before (and the same counts).

Parts have the columns ``position`` (int64, the instance's place in the job), ``instance_id``,
``category``, ``outcome`` (scored, error, skipped or not_applicable) and ``record`` (the item's
record as the log line carries it, JSON). A chunk's positions are ``[start, start + chunk_size)``
of its run (``evalq.shared.cluster.spec``), so any position's part is known without a lookup.
"""

from __future__ import annotations

import io
import threading
import zlib
from collections import OrderedDict
from typing import Any, Iterable, Iterator

from evalq.shared.cluster import keys
from evalq.shared.cluster.spec import entry_of
from evalq.shared.core.jsonio import encode
from evalq.shared.scores.results import outcome
from evalq.shared.store.place import Place

PARTS = "parts"  # spec["records"] of a job whose records are parts

# the chunk's count replaced, the total moved by the difference: a chunk written again changes nothing
_COUNT = """
local old = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return redis.call('INCRBY', KEYS[2], tonumber(ARGV[2]) - old)
"""


def in_parts(spec: dict) -> bool:
    return spec.get("records") == PARTS and bool(spec.get("instances"))


def part_name(key: str, start: int) -> str:
    from urllib.parse import quote

    return f"records/entry={quote(key, safe='')}/chunk-{start:09d}.parquet"


def write(pipe: Any, spec: dict, job_id: str, key: str, start: int, new: dict[int, dict],
          whole: list[tuple[int, dict]] | None, values: dict | None = None, view: dict | None = None) -> None:
    """Queue on ``pipe`` (the chunk's MULTI transaction) what the chunk recorded: ``new`` (the
    records made by this run) into ``res:{M}``, or ``whole`` (every record of the chunk, earlier
    runs' included) as its part, written to the store now, with ``values`` (what the history
    store needs of the chunk, ``evalq.results.recording.chunk_values``) and ``view`` (what the
    report needs of it, ``evalq.results.report.chunk_view``) in the part's metadata; and the
    chunk's count. ``whole`` None: the chunk has not ended (a deferred run), nothing is counted."""
    if in_parts(spec):
        if whole:
            meta = {VALUES_KEY: values, VIEW_KEY: view}
            Place.from_json(spec["instances"]).put(part_name(key, start), _encode(whole, meta))
    elif new:
        # HSET by instance position: a redelivered chunk overwrites, it never adds.
        pipe.hset(keys.results(job_id, key), mapping={str(p): encode(rec) for p, rec in new.items()})
    if whole is not None:
        pipe.eval(_COUNT, 2, keys.recorded(job_id, key), keys.recorded_total(job_id, key), start, len(whole))


def count(r: Any, job_id: str, key: str) -> int:
    return int(r.get(keys.recorded_total(job_id, key)) or 0)


def get_many(r: Any, spec: dict, job_id: str, key: str, positions: list[int],
             complete: bool = False) -> list:
    """The stored records (JSON, str or bytes) at ``positions``, None where none was written.
    ``complete``: the run has ended (its parts will not change), so parts may come from this
    process's cache (the generation stage's outputs, read by every metric chunk)."""
    if not positions:
        return []
    if not in_parts(spec):
        return r.hmget(keys.results(job_id, key), [str(p) for p in positions])
    size = entry_of(spec, key)["chunk_size"]
    found: dict[int, str] = {}
    for start in sorted({p - p % size for p in positions}):
        found.update(read_part(spec, key, start, cached=complete))
    return [found.get(p) for p in positions]


def scan(r: Any, spec: dict, job_id: str, key: str) -> Iterator[tuple[int, Any]]:
    """(position, record JSON) of every record of the run: a part at a time, in chunk order
    (from Redis: in no order)."""
    if not in_parts(spec):
        for position, raw in r.hscan_iter(keys.results(job_id, key), count=5000):
            yield int(position), raw
        return
    for start in sorted(int(s) for s in r.hkeys(keys.recorded(job_id, key))):
        yield from sorted(read_part(spec, key, start).items())


_CACHE: "OrderedDict[tuple[str, str], dict[int, str]]" = OrderedDict()
_CACHED = 64  # parts of ended runs a process keeps (a generation stage's chunks are small)
_LOCK = threading.Lock()


def read_part(spec: dict, key: str, start: int, cached: bool = False) -> dict[int, str]:
    """The chunk's records by position ({} where the chunk wrote no part)."""
    place, name = Place.from_json(spec["instances"]), part_name(key, start)
    if cached:
        with _LOCK:
            hit = _CACHE.get((place.uri, name))
            if hit is not None:
                _CACHE.move_to_end((place.uri, name))
                return hit
    data = place.get(name, missing_ok=True)
    records = _decode(data) if data is not None else {}
    if cached and data is not None:
        with _LOCK:
            _CACHE[(place.uri, name)] = records
            while len(_CACHE) > _CACHED:
                _CACHE.popitem(last=False)
    return records


VALUES_KEY = b"evalq.values"  # the part's metadata key of the chunk's history values (JSON, zlib'd)
VIEW_KEY = b"evalq.view"  # and of its report view (JSON, zlib'd)


def chunk_values(spec: dict, r: Any, job_id: str, key: str) -> Iterator[tuple[int, bytes | None]]:
    """(chunk start, the history values its part carries, or None) of every chunk recorded so far."""
    return chunk_meta(spec, r, job_id, key, VALUES_KEY)


def chunk_meta(spec: dict, r: Any, job_id: str, key: str, name: bytes) -> Iterator[tuple[int, bytes | None]]:
    """(chunk start, what its part carries under ``name`` (``VALUES_KEY``, ``VIEW_KEY``), or None) of
    every chunk recorded so far, in start order, a part at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    place = Place.from_json(spec["instances"])
    for start in sorted(int(s) for s in r.hkeys(keys.recorded(job_id, key))):
        data = place.get(part_name(key, start), missing_ok=True)
        meta = pq.read_schema(pa.BufferReader(data)).metadata if data is not None else None
        packed = (meta or {}).get(name)
        yield start, zlib.decompress(packed) if packed is not None else None


def _encode(records: Iterable[tuple[int, dict]], meta: dict[bytes, dict | None] | None = None) -> bytes:
    import pyarrow.parquet as pq

    from evalq.shared.store.columns import int64s, strings, table as make_table

    rows = list(records)
    table = make_table({
        "position": int64s(p for p, _ in rows),
        "instance_id": strings([str(rec.get("instance_id")) for _, rec in rows]),
        "category": strings([rec.get("category") if isinstance(rec.get("category"), str) else None
                             for _, rec in rows]),
        "outcome": strings([outcome(rec) for _, rec in rows]),  # as results.json counts it
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


def locations(spec: dict) -> dict:
    """Where a job's parts are (``evalq results``): its folder, and a glob per part kind and run."""
    from evalq.shared.cluster.spec import runs

    if not in_parts(spec):
        return {"store": None}
    folder = spec["instances"]["uri"].rstrip("/")
    return {"store": folder, "instances": f"{folder}/instances/part-*.parquet",
            "records": {key: f"{folder}/{part_name(key, 0).rsplit('/', 1)[0]}/chunk-*.parquet" for key, _ in runs(spec)}}
