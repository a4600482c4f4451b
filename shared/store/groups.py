"""Record parts of about a thousand items for a judge entry planned in smaller chunks (issue 73).

A judge entry's chunks are small where the job asks (``chunk_size``; 4 items: a night of a million
judged items wrote 250,000 parts, and the final callback read every one). A judge entry of more than
``SPREAD`` chunks smaller than ``PART_ITEMS`` items has a ``part_size`` (``part_size``: whole chunks, at
least ``PART_ITEMS`` items), and writes one part per group of chunks ``[G, G + part_size)``, named by
its first position as any part is (``records/entry=<key>/chunk-<G>.parquet``); one of at most
``SPREAD`` chunks (a small entry, a sixteenth of it a chunk) writes a part per chunk as ever:

1. A chunk that ends puts its records and what its part would carry (history values, report view,
   aggregate, time, accounting) in Redis (``keys.gathering``, a field per chunk start), in the
   chunk's own transaction, the one that takes its kept items away and counts its records: from then
   on the chunk is recorded, as a chunk with its own part was.
2. After that transaction the chunk looks whether every chunk of its group is gathered. The one that
   finds them all claims the group (``keys.gathering_claim``; a claim lapses after ``CLAIM_SECONDS``
   if its holder dies), writes the group's part whole (each chunk's metadata under its start, and
   ``evalq.chunks``: each chunk's count of records), and only then takes the group's chunks out of
   Redis. A chunk that finds the group claimed waits for the part (or for the claim to lapse, and
   then writes it itself): the last chunk of a group never ends before its group's part is written,
   so a stage's callback, which runs once every chunk has ended, reads parts only.

A chunk run again finds its items in the group's part, or in its gathered field (``PartRecords``
reads both), and pays for nothing; two writers of a group write the same records from the same
complete snapshot, so nothing is lost or doubled. What Redis alone holds is the gathered chunks of
groups not yet written: after Redis loses the job (``evalq.orchestrator.rebuild``) those chunks run
again, their calls paid again, at most a group (``part_size`` items) per entry and group in progress,
on top of the calls in flight."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Callable, NamedTuple

from evalq.shared.cluster import keys
from evalq.shared.core.jsonio import encode

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


def part_size(chunk_size: int, items: int) -> int | None:
    """Items per record part of a judge entry of ``items`` planned in chunks of ``chunk_size``: whole
    chunks, at least ``PART_ITEMS``; None (a part per chunk) where a chunk holds that many already,
    or where the entry has at most ``SPREAD`` chunks (a part per chunk is at most ``SPREAD`` parts,
    each of its chunks' records in the store as soon as it ends)."""
    if chunk_size >= PART_ITEMS or -(-items // chunk_size) <= SPREAD:
        return None
    return chunk_size * -(-PART_ITEMS // chunk_size)


def gather(pipe: Any, job_id: str, key: str, start: int, whole: list[tuple[int, dict]], meta: dict,
           ttl: int) -> None:
    """Queue on ``pipe`` (the chunk's transaction) the chunk's records and ``meta`` (by name:
    values, view, part, elapsed, acct), to wait in Redis for its group's part (``ttl``: the job's)."""
    name = keys.gathering(job_id, key)
    pipe.hset(name, str(start), encode({"records": [[p, rec] for p, rec in whole], "meta": meta}))
    if ttl:  # the job's retention (its keys go with the job's anyway)
        pipe.expire(name, ttl)


def gathered_records(r: Any, job_id: str, key: str, starts: list[int]) -> dict[int, dict]:
    """Chunk start -> what it gathered ({"records": [[position, record], ...], "meta": {...}}), of
    those of ``starts`` that wait in Redis."""
    if not starts:
        return {}
    raw = r.hmget(keys.gathering(job_id, key), [str(s) for s in starts])
    return {s: json.loads(blob) for s, blob in zip(starts, raw) if blob is not None}


def write_when_whole(r: Any, job_id: str, key: str, grouping: Grouping, start: int,
                     write: Callable[[int, dict[int, dict]], None]) -> bool:
    """After the chunk at ``start`` gathered: where its group is whole, ``write(first, chunks)`` its
    part (once, by the chunk that claims it; a chunk that finds it claimed waits for it), then take
    its chunks out of Redis. True when this chunk wrote it."""
    first = grouping.first(start)
    starts = grouping.starts(first)
    fields = [str(s) for s in starts]
    claim, owner = keys.gathering_claim(job_id, key, first), f"{start}:{uuid.uuid4().hex}"
    while True:
        raw = r.hmget(keys.gathering(job_id, key), fields)
        if any(blob is None for blob in raw):  # not whole yet, or written (and taken away) already
            return False
        if r.set(claim, owner, nx=True, ex=CLAIM_SECONDS):
            try:
                write(first, {s: json.loads(blob) for s, blob in zip(starts, raw)})
                pipe = r.pipeline(transaction=True)
                pipe.hdel(keys.gathering(job_id, key), *fields)
                pipe.delete(claim)
                pipe.execute()
            except BaseException:
                if r.get(claim) == owner.encode():
                    r.delete(claim)
                raise
            return True
        time.sleep(LOOK)  # another chunk writes it: its part is there before this chunk ends


def group_meta(chunks: dict[int, dict], names: dict[bytes, str]) -> dict[bytes, dict]:
    """A group part's metadata: under each of ``names`` (metadata key -> the gathered meta's name),
    chunk start -> what that chunk gathered under it; and ``CHUNKS_KEY``: each chunk's count."""
    meta: dict[bytes, dict] = {CHUNKS_KEY: {str(s): len(c["records"]) for s, c in chunks.items()}}
    for key, name in names.items():
        meta[key] = {str(s): c["meta"].get(name) for s, c in chunks.items() if c["meta"].get(name) is not None}
    return meta
