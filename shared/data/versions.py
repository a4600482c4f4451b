"""A dataset's version: what the validated instances are, as a digest, a count and a table of
the instances' own hashes, so that a suite's nights say when their data moved (issue 75).

- **The digest** names the instances' content whatever their order: blake2b over the instances
  sorted by the hash of their id, each as (id hash, content hash). Two runs on the same digest ran
  on the same test cases.
- **The content** of an instance is its fields except what a night's system under test gives or
  people add (``UNVERSIONED``: the answer, what the application retrieved, a transcript, people's
  grades, the ids of a trace's span), so a suite whose answers change every night keeps its
  version while its questions and references stay. A job names the fields itself with
  ``regression.dataset_fields``.
- **The table** holds (id hash, content hash) of the instances the history store keeps values of
  for pairing (``in_sample``: every instance up to ``EVALQ_HISTORY_MAX_ITEMS``, else a sample by
  id hash, the same instances in every run), 16 bytes each: which ids two runs share unchanged,
  which were added, removed or changed.

Hashed as the instances are checked (``InstanceChecker``), one at a time, whatever reads them (a
job's inline list, a dataset read by one process or several): 16 bytes an instance until the job
is stored.
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass
from typing import Callable, Iterable

from evalq.shared.core.jsonio import encode_sorted

# what a night's system answers (its output, the passages it retrieved, a conversation's or agent's
# transcript), what people add (grades), and evalq's own (a trace's span ids): never the test case
UNVERSIONED = frozenset({"actual-output", "context", "messages", "human", "otel"})
TABLE_FILE = "dataset-version.bin"  # a stored job's table, in its folder of the job store
TABLE_ROW = 16  # bytes a kept instance takes in a table: its id hash, its content hash


def id_hash(iid: str) -> int:
    """An instance id's 64-bit hash (unsigned): the history's sample and the version tables key by it."""
    return int.from_bytes(hashlib.blake2b(iid.encode("utf-8"), digest_size=8).digest(), "big")


def in_sample(rate: float) -> Callable[[str], bool] | None:
    """Whether an instance is in a run's sample at ``rate``: its id hash under the rate, so that
    every run keeps the same instances (a run at a lower rate keeps a subset of another's), and two
    runs of a suite pair over the smaller sample. None: every instance."""
    if rate >= 1.0:
        return None
    bound = sample_bound(rate)
    return lambda iid: id_hash(iid) < bound


def sample_bound(rate: float) -> int:
    return int(rate * 2 ** 64)


class VersionCounter:
    """Each checked instance's (id hash, content hash), in order; ``fields``: the fields a version
    covers (None: all but ``UNVERSIONED``)."""

    def __init__(self, fields: Iterable[str] | None = None):
        self.fields = tuple(fields) if fields is not None else None
        self.ids, self.contents = array("Q"), array("Q")

    def add(self, inst: dict) -> None:
        if self.fields is None:
            content = {k: v for k, v in inst.items() if k not in UNVERSIONED}
        else:
            content = {k: inst[k] for k in self.fields if k in inst}
            content["id"] = inst["id"]
        self.ids.append(id_hash(str(inst["id"])))
        self.contents.append(int.from_bytes(
            hashlib.blake2b(encode_sorted(content).encode("utf-8"), digest_size=8).digest(), "big"))

    def apart(self) -> "VersionCounter":
        return VersionCounter(self.fields)

    def merge(self, ids: array, contents: array) -> None:
        self.ids.extend(ids)
        self.contents.extend(contents)

    def version(self, rate: float = 1.0) -> "Version":
        """The version of what was counted: its digest, count, and the table of the instances in
        ``rate``'s sample."""
        import numpy as np

        ids = np.frombuffer(self.ids, dtype=np.uint64) if len(self.ids) else np.zeros(0, dtype=np.uint64)
        contents = np.frombuffer(self.contents, dtype=np.uint64) if len(self.contents) else np.zeros(0, np.uint64)
        order = np.argsort(ids, kind="stable")
        ids, contents = ids[order], contents[order]
        rows = np.empty((len(ids), 2), dtype="<u8")
        rows[:, 0], rows[:, 1] = ids, contents
        digest = hashlib.blake2b(rows.tobytes(), digest_size=16).hexdigest()
        if rate < 1.0:
            rows = rows[ids < np.uint64(sample_bound(rate))]
        return Version(digest, len(ids), rate, rows.tobytes())


@dataclass(frozen=True)
class Version:
    """A dataset version: ``digest``, ``n`` instances, and ``table`` (rows of (id hash, content hash),
    little-endian uint64s, sorted by id hash) of the instances in ``rate``'s sample."""

    digest: str
    n: int
    rate: float
    table: bytes

    def head(self) -> dict:
        """What a stored job and run.json say of it."""
        return {"digest": self.digest, "n": self.n, "rate": self.rate}


@dataclass(frozen=True)
class Change:
    """How one version's instances differ from another's, over the ids both tables could hold (the
    smaller of their samples): counts, and the id hashes of each kind."""

    added: list[int]
    removed: list[int]
    changed: list[int]
    unchanged: set[int]
    rate: float  # the share of ids both tables hold: the counts are a sample's below 1

    def counts(self) -> dict:
        """Each count, scaled to the whole dataset where the tables hold a sample (``about``)."""
        scale = 1.0 / self.rate if self.rate < 1.0 else 1.0
        return {"added": round(len(self.added) * scale), "removed": round(len(self.removed) * scale),
                "changed": round(len(self.changed) * scale), "about": self.rate < 1.0}


def rows_of(table: bytes):
    import numpy as np

    rows = np.frombuffer(table, dtype="<u8")
    return rows.reshape(-1, 2) if len(rows) else np.zeros((0, 2), dtype="<u8")


def change(new: bytes, new_rate: float, old: bytes, old_rate: float) -> Change:
    """What ``new`` (a table) added, removed and changed against ``old``, over the ids in both samples."""
    import numpy as np

    rate = min(new_rate, old_rate)
    a, b = rows_of(new), rows_of(old)
    if rate < 1.0:
        bound = np.uint64(sample_bound(rate))
        a, b = a[a[:, 0] < bound], b[b[:, 0] < bound]
    shared, ia, ib = np.intersect1d(a[:, 0], b[:, 0], assume_unique=True, return_indices=True)
    same = a[ia, 1] == b[ib, 1]
    return Change(added=np.setdiff1d(a[:, 0], shared, assume_unique=True).tolist(),
                  removed=np.setdiff1d(b[:, 0], shared, assume_unique=True).tolist(),
                  changed=shared[~same].tolist(), unchanged=set(shared[same].tolist()), rate=rate)
