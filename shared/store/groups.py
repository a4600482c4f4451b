"""Record parts of about a thousand items for a judge entry planned in smaller chunks (issue 73).

A judge entry's chunks are small where the job asks (``chunk_size``; 4 items: a night of a million
judged items wrote 250,000 parts, and the final callback read every one). A judge entry of more than
``SPREAD`` chunks smaller than ``PART_ITEMS`` items has a ``part_size`` (``part_size``: whole chunks, at
least ``PART_ITEMS`` items), and writes one part per group of chunks ``[G, G + part_size)``, named by
its first position as any part is (``records/entry=<key>/chunk-<G>.parquet``); one of at most
``SPREAD`` chunks (a small entry, a sixteenth of it a chunk) writes a part per chunk as ever:

1. A chunk that ends writes its records, with what its own part would carry (history values, report
   view, aggregate, time, accounting), to the store as a pending part
   (``records/entry=<key>/pending-<start>.parquet``, a chunk's part by another name), before its own
   transaction, which marks it in Redis (``keys.gathering``: chunk start -> 1, control state only),
   counts its records and takes its kept items away: from then on the chunk is recorded and in the
   store, as a chunk with its own part was.
2. After that transaction the chunk looks whether every chunk of its group is marked. The one that
   finds them all claims the group (``keys.gathering_claim``; a claim lapses after ``CLAIM_SECONDS``
   if its holder dies), reads the group's pending parts, writes the group's part whole (each chunk's
   metadata under its start, and ``evalq.chunks``: each chunk's count of records), removes the
   pending parts and only then the marks. A chunk that finds the group claimed waits for the part
   (or for the claim to lapse, and then writes it itself): the last chunk of a group never ends
   before its group's part is written, so a stage's callback reads whole groups' parts.

A chunk run again finds its items in the group's part or in its pending part (``PartRecords`` reads
both) and pays for nothing; a writer that finds a pending part gone writes nothing (another wrote the
group from the same parts), so nothing is lost or doubled. Redis keeps no record: after Redis loses
the job (``evalq.orchestrator.rebuild``) a pending part is a chunk done, as a chunk's own part is
(``evalq.shared.store.ledger.chunks_done``), and a group some of whose chunks landed before the loss
keeps its pending parts (its marks went with Redis: readers read the pending parts, and nothing
writes that group's part)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Callable, NamedTuple

from evalq.shared.cluster import keys
from evalq.shared.store.part_meta import CARRIED, part_name, unpacked

PART_ITEMS = 1000  # a judge entry's record part holds at least this many items (whole chunks) ...
SPREAD = 16  # ... where it has more chunks than this (the judge entries' spread: a sixteenth of an entry)
CLAIM_SECONDS = 60  # a group's writer holds its claim this long at most (a writer that died lets go)
LOOK = 0.05  # seconds between two looks at a group another chunk is writing
CHUNKS_KEY = b"evalq.chunks"  # a group's part metadata: chunk start -> its records' count


class Grouping(NamedTuple):
    """A run's chunks grouped into parts: ``chunk`` items a chunk, ``part`` a part, ``span`` positions."""
    chunk: int
    part: int
    span: int

    def first(self, start: int) -> int:
        """The first position of the group (and the name of its part) of the chunk at ``start``."""
        return start - start % self.part

    def starts(self, first: int) -> list[int]:
        """The chunk starts of the group from ``first``."""
        return list(range(first, min(first + self.part, self.span), self.chunk))

    def by_group(self, starts: list[int]) -> list[tuple[int, list[int]]]:
        """(a group's first position, its chunks among ``starts``), in order."""
        groups: dict[int, list[int]] = {}
        for s in starts:
            groups.setdefault(self.first(s), []).append(s)
        return sorted(groups.items())


def part_size(chunk_size: int, items: int) -> int | None:
    """Items per record part of a judge entry of ``items`` planned in chunks of ``chunk_size``: whole
    chunks, at least ``PART_ITEMS``; None (a part per chunk) where a chunk holds that many already,
    or where the entry has at most ``SPREAD`` chunks (a part per chunk is at most ``SPREAD`` parts,
    each of its chunks' records in the store as soon as it ends)."""
    if chunk_size >= PART_ITEMS or -(-items // chunk_size) <= SPREAD:
        return None
    return chunk_size * -(-PART_ITEMS // chunk_size)


def pending_name(key: str, start: int) -> str:
    """A chunk's part until its group's part holds it."""
    return part_name(key, start).replace("/chunk-", "/pending-")


def pending_parts(place: Any, key: str, starts: list[int], decode: Callable) -> dict[int, tuple[dict, dict]]:
    """Chunk start -> (records by position, its part's metadata by key) of those of ``starts`` whose
    pending part is in the store (``place``; ``decode``: a part's records by position)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    found = {}
    for s in starts:
        data = place.get(pending_name(key, s), missing_ok=True)
        if data is not None:
            meta = pq.read_schema(pa.BufferReader(data)).metadata
            found[s] = (decode(data), {name: unpacked(meta, name) for name in CARRIED})
    return found


def write_group(place: Any, job_id: str, key: str, first: int, starts: list[int], encode_part: Callable,
                decode: Callable) -> bool:
    """The group's part from its chunks' pending parts, which then go; False (nothing written) where
    one is gone: another chunk wrote the group from them."""
    from evalq.shared.cluster import journal

    chunks = pending_parts(place, key, starts, decode)
    if len(chunks) < len(starts):
        return False
    rows = sorted((p, json.loads(record)) for records, _ in chunks.values() for p, record in records.items())
    place.put(part_name(key, first), encode_part(rows, group_meta(chunks)))
    journal.note("part", job_id, journal.chunk_id(key, first), n=len(rows))
    for s in starts:
        place.remove(pending_name(key, s))
    return True


def mark(pipe: Any, job_id: str, key: str, start: int, ttl: int) -> None:
    """Queue on ``pipe`` (the chunk's transaction) that the chunk at ``start`` has its pending part in
    the store (``ttl``: the job's retention)."""
    name = keys.gathering(job_id, key)
    pipe.hset(name, str(start), 1)
    if ttl:  # (its keys go with the job's anyway)
        pipe.expire(name, ttl)


def marked(r: Any, job_id: str, key: str, starts: list[int]) -> list[int]:
    """Those of ``starts`` whose chunk Redis marks as having its pending part in the store: a chunk
    run looks for its earlier records there only (a chunk's first run costs the store no look)."""
    if not starts:
        return []
    return [s for s, m in zip(starts, r.hmget(keys.gathering(job_id, key), [str(s) for s in starts])) if m]


def write_when_whole(r: Any, job_id: str, key: str, grouping: Grouping, start: int,
                     write: Callable[[int, list[int]], bool]) -> bool:
    """After the chunk at ``start`` landed: where every chunk of its group has, ``write(first, starts)``
    the group's part (once, by the chunk that claims it; a chunk that finds it claimed waits for it;
    ``write`` says False where a pending part is gone: another wrote the group), then take the group
    out of Redis. True when this chunk wrote it."""
    first = grouping.first(start)
    starts = grouping.starts(first)
    fields = [str(s) for s in starts]
    claim, owner = keys.gathering_claim(job_id, key, first), f"{start}:{uuid.uuid4().hex}"
    while True:
        if any(mark is None for mark in r.hmget(keys.gathering(job_id, key), fields)):
            return False  # not whole yet, or written (and taken out) already
        if r.set(claim, owner, nx=True, ex=CLAIM_SECONDS):
            try:
                wrote = write(first, starts)
                pipe = r.pipeline(transaction=True)
                pipe.hdel(keys.gathering(job_id, key), *fields)
                pipe.delete(claim)
                pipe.execute()
            except BaseException:
                if r.get(claim) == owner.encode():
                    r.delete(claim)
                raise
            return wrote
        time.sleep(LOOK)  # another chunk writes it: its part is there before this chunk ends


def group_meta(chunks: dict[int, tuple[dict, dict]]) -> dict[bytes, dict]:
    """A group part's metadata: under each key a chunk's part carries, chunk start -> what that chunk's
    pending part carries under it; and ``CHUNKS_KEY``: each chunk's count of records. ``chunks``: chunk
    start -> (its records by position, its part's metadata by key)."""
    meta: dict[bytes, dict] = {CHUNKS_KEY: {str(s): len(records) for s, (records, _) in chunks.items()}}
    for name in {name for _, carried in chunks.values() for name in carried}:
        meta[name] = {str(s): carried[name] for s, (_, carried) in chunks.items() if carried.get(name) is not None}
    return meta
