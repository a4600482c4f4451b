"""A job's instances staged in the job store as Parquet parts, read back by position.

At submission the instances (validated, in their stored form: one JSON text each, shared fields
as references, ``evalq.shared.data.instances.json_lines``) are cut into parts of about
``PART_BYTES`` of JSON (at most ``PART_ROWS`` instances) and written as
``instances/part-<n>.parquet`` in the job's folder (columns ``position`` int64 and ``instance``
string, zstd, row groups of ``ROW_GROUP``). The stored job says where (``StoredJob.staged``:
the folder, and the first position of each part), so a chunk task carries only its positions and
a worker reads the parts that hold them. Redis keeps none of it.

A worker keeps the last ``CACHED_PARTS`` parts it read (their ``instance`` column, as Arrow
holds it): consecutive chunks of a job mostly fall in one part, so a part is fetched once per
worker process, not once per chunk. Parts are never rewritten under the same name with other
content (a redelivered submission stages the same instances again), so the cache is never stale.

Without a store (no ``EVALQ_STORE``) the instances stay in the job's Redis list, as before. The
two are one interface (``RedisInstances``, ``PartInstances``: lines by range or by position, shared
values put back, dropped), chosen once by the stored job (``instances_of``).
"""

from __future__ import annotations

import bisect
import io
import json
import threading
from collections import OrderedDict
from typing import Any, Iterable

from evalq.shared.store.place import Place

PART_BYTES = 8 << 20
PART_BYTES_ENV = "EVALQ_STORE_PART_BYTES"
PART_ROWS = 50_000
ROW_GROUP = 2048
CACHED_PARTS = 2
FORMAT = "parquet"


def staged_bytes(instances: Iterable[dict]) -> int:
    """The bytes the instances take stored: their JSON lines (shared fields as references: a spool's
    size, or the inline instances' lines counted) and the one copy of each shared value."""
    from evalq.shared.data.instances import SpooledInstances, json_lines

    if isinstance(instances, SpooledInstances):
        return instances.size() + sum(len(v.encode("utf-8")) for v in instances.shared.values())
    shared: dict[str, str] = {}
    lines = sum(len(line.encode("utf-8")) + 1 for line in json_lines(instances, shared))
    return lines + sum(len(v.encode("utf-8")) for v in shared.values())


SHARED_PART = "instances/shared.parquet"


def stage_shared(place: Place, shared: dict[str, str]) -> bool:
    """The values the instances share (digest -> JSON text: their tool definitions) as one part
    beside them, so that a job staged in the store keeps none of its text in Redis (issue 70: a
    9.1 MB job's tools went to the broker's Redis for 7 days). Whether there were any."""
    if not shared:
        return False
    import pyarrow.parquet as pq

    from evalq.shared.store.columns import strings, table as make_table

    table = make_table({"digest": strings(list(shared)), "value": strings(list(shared.values()))})
    out = io.BytesIO()
    pq.write_table(table, out, compression="zstd")
    place.put(SHARED_PART, out.getvalue())
    return True


def part_name(index: int) -> str:
    return f"instances/part-{index:05d}.parquet"


def still_staged(staged: dict) -> bool:
    """Whether a staged job's folder still holds its first part (``evalq gc`` removes a folder whole,
    a lifecycle rule its parts): asked without reading it. A job of no instances has none."""
    return not staged.get("n") or Place.from_json(staged).exists(part_name(0))


def stage(place: Place, lines: Iterable[str], part_bytes: int | None = None, part_rows: int = PART_ROWS) -> dict:
    """Write ``lines`` (one instance's JSON each, in job order) as parts under ``place``;
    returns what the stored job keeps of them (``StoredJob.staged``). ``part_bytes``: about how much
    JSON a part holds (``EVALQ_STORE_PART_BYTES``, 8 MiB by default)."""
    if part_bytes is None:
        from evalq.shared.core.config import env_number

        part_bytes = max(1, int(env_number(PART_BYTES_ENV, PART_BYTES)))
    starts: list[int] = []
    batch: list[str] = []
    size = n = 0
    for line in lines:
        batch.append(line)
        size += len(line)
        n += 1
        if size >= part_bytes or len(batch) >= part_rows:
            starts.append(n - len(batch))
            place.put(part_name(len(starts) - 1), _encode(starts[-1], batch))
            batch, size = [], 0
    if batch:
        starts.append(n - len(batch))
        place.put(part_name(len(starts) - 1), _encode(starts[-1], batch))
    return {"format": FORMAT, **place.as_json(), "n": n, "starts": starts}


def _encode(start: int, batch: list[str]) -> bytes:
    import pyarrow.parquet as pq

    from evalq.shared.store.columns import int64s, strings, table as make_table

    table = make_table({"position": int64s(range(start, start + len(batch))), "instance": strings(batch)})
    out = io.BytesIO()
    pq.write_table(table, out, compression="zstd", row_group_size=ROW_GROUP)
    return out.getvalue()


_PARTS: "OrderedDict[tuple[str, int], Any]" = OrderedDict()  # (folder, part) -> its instance column
_LOCK = threading.Lock()  # a worker's threads (its pool's, the read-ahead's) share the cache


def _column(staged: dict, index: int):
    key = (staged["uri"], index)
    with _LOCK:
        column = _PARTS.get(key)
        if column is not None:
            _PARTS.move_to_end(key)
            return column
    from evalq.shared.store.columns import read

    column = read(Place.from_json(staged).get(part_name(index)), ["instance"]).column("instance")
    with _LOCK:
        _PARTS[key] = column
        while len(_PARTS) > CACHED_PARTS:
            _PARTS.popitem(last=False)
    return column


def _rows(staged: dict, index: int, positions: list[int]) -> dict[int, str]:
    """A few scattered positions of one part (the report's worst items, a trace's spans): from the
    worker's cached part where it has it, else only the row groups that hold them, left uncached
    (a final callback reading one item here and there must not decode and keep whole parts)."""
    start = staged["starts"][index]
    with _LOCK:
        column = _PARTS.get((staged["uri"], index))
    if column is not None:
        return {p: column[p - start].as_py() for p in positions}
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = Place.from_json(staged).get(part_name(index))
    part = pq.ParquetFile(pa.BufferReader(data))
    bounds, first = [], 0
    for g in range(part.metadata.num_row_groups):
        bounds.append(first)
        first += part.metadata.row_group(g).num_rows
    found = {}
    for g in sorted({bisect.bisect_right(bounds, p - start) - 1 for p in positions}):
        rows = part.read_row_group(g, columns=["instance"]).column("instance")
        for p in positions:
            if 0 <= p - start - bounds[g] < len(rows):
                found[p] = rows[p - start - bounds[g]].as_py()
    return found


def staged_lines(staged: dict, lo: int, hi: int) -> list[str]:
    """The stored JSON of positions ``lo`` to ``hi - 1`` (fewer where the job has fewer)."""
    starts, n = staged["starts"], staged["n"]
    hi = min(hi, n)
    out: list[str] = []
    p = lo
    while p < hi:
        index = bisect.bisect_right(starts, p) - 1
        end = starts[index + 1] if index + 1 < len(starts) else n
        take = min(hi, end)
        out.extend(_column(staged, index).slice(p - starts[index], take - p).to_pylist())
        p = take
    return out


_DECODED: "OrderedDict[str, Any]" = OrderedDict()  # digest -> decoded value (content-addressed: any job's)
_DECODED_MAX = 64


def instances_of(staged: dict | None, job_id: str | None) -> "RedisInstances | PartInstances":
    """A job's instances: its parts where the store holds them (``staged``: where, as the stored job
    keeps it), else its Redis list. Chosen once, by the stored job: no caller asks which."""
    return PartInstances(job_id, staged) if staged else RedisInstances(job_id)


class _Instances:
    job_id: str | None

    def with_shared(self, r: Any, instances: list[dict]) -> list[dict]:
        """Instances read back from storage with their shared values in place: each value is fetched
        (``shared_values``) and decoded once per process (a worker scores chunk after chunk of the
        same job)."""
        from evalq.shared.data.instances import shared_refs, unshare

        wanted = {digest for inst in instances for digest in shared_refs(inst)}
        if not wanted:
            return instances
        missing = [d for d in wanted if d not in _DECODED]
        if missing:
            for digest, text in zip(missing, self.shared_values(r, missing)):
                if text is None:
                    raise LookupError(f"job {self.job_id}: a shared instance value ({digest}) is gone from where "
                                      "it was kept")
                _DECODED[digest] = json.loads(text)
        values = {d: _DECODED[d] for d in wanted}
        for d in wanted:
            _DECODED.move_to_end(d)
        while len(_DECODED) > _DECODED_MAX:
            _DECODED.popitem(last=False)
        return [unshare(inst, values) for inst in instances]

    def shared_values(self, r: Any, digests: list[str]) -> list:
        """The JSON of the values the instances share, by digest (None where there is none): the
        job's Redis hash."""
        from evalq.shared.cluster import keys

        return r.hmget(keys.shared_values(self.job_id), digests)


class RedisInstances(_Instances):
    """A job's instances in its Redis list (no job store)."""

    def __init__(self, job_id: str | None):
        self.job_id = job_id

    def lines(self, r: Any, lo: int, hi: int) -> list:
        """The stored JSON (str or bytes) of the job's instances ``lo`` to ``hi - 1``."""
        if hi <= lo:
            return []
        from evalq.shared.cluster import keys

        return r.lrange(keys.instances(self.job_id), lo, hi - 1)

    def lines_at(self, r: Any, positions: list[int]) -> list:
        """The stored JSON of the instances at ``positions`` (None where there is none), in that order."""
        from evalq.shared.cluster import keys

        pipe = r.pipeline(transaction=False)
        for p in positions:
            pipe.lindex(keys.instances(self.job_id), p)
        return pipe.execute()

    def drop(self) -> None:
        """Nothing outside Redis to remove (the job's keys expire with it)."""

    def still_there(self) -> bool:
        return True


class PartInstances(_Instances):
    """A job's instances as Parquet parts in the job store (``staged``: the folder, and the first
    position of each part)."""

    def __init__(self, job_id: str | None, staged: dict):
        self.job_id, self.staged = job_id, staged

    def lines(self, r: Any, lo: int, hi: int) -> list:
        return staged_lines(self.staged, lo, hi)

    def lines_at(self, r: Any, positions: list[int]) -> list:
        staged = self.staged
        by_part: dict[int, list[int]] = {}
        for p in set(positions):
            if 0 <= p < staged["n"]:
                by_part.setdefault(bisect.bisect_right(staged["starts"], p) - 1, []).append(p)
        found: dict[int, Any] = {}
        for index, wanted in by_part.items():
            found.update(_rows(staged, index, wanted))
        return [found.get(p) for p in positions]

    def shared_values(self, r: Any, digests: list[str]) -> list:
        """Their part in the job store where the job was staged there with some, else the Redis hash."""
        if not self.staged.get("shared"):
            return super().shared_values(r, digests)
        from evalq.shared.store.columns import read

        table = read(Place.from_json(self.staged).get(SHARED_PART))
        values = dict(zip(table.column("digest").to_pylist(), table.column("value").to_pylist()))
        return [values.get(d) for d in digests]

    def drop(self) -> None:
        """Remove the staged parts (a submission that failed, an embedded run's end)."""
        Place.from_json(self.staged).delete()

    def still_there(self) -> bool:
        return still_staged(self.staged)
