"""The job in the store (issue 72): what a cluster needs to rebuild a running job after its Redis
lost it, kept outside Redis.

At submission, before its first chunk is sent, a job staged in the store gets two more files: its
stored document (``job.json`` in its folder, as Redis holds it under ``keys.spec``: no secret is
ever in it) and a marker that it runs (``<store>/_running/<job id>.json``, naming its folder; a
tenant's name never begins with ``_``). The final callback removes the marker; ``evalq cancel`` leaves
a ``cancelled`` file beside the document, so a job rebuilt after a loss stays cancelled. A chunk is done
when its record part exists (``evalq.shared.store.records``: written whole before the chunk's Redis
transaction), and the part's rows are the records it counted: so the store alone says which chunks
are done and how many items each recorded. ``evalq.orchestrator.rebuild`` reads it back.
"""

from __future__ import annotations

import json
from typing import Iterator, NamedTuple

from evalq.shared.store.place import Place

JOB_DOCUMENT = "job.json"
CANCELLED = "cancelled"  # in the job's folder once it was cancelled: a rebuilt job stays cancelled
RUNNING = "_running"  # the folder of running jobs' markers: not a tenant's (no tenant's name begins with _)
REQUESTS = "requests"  # in it: the markers of queue requests whose jobs run (by their binding's digest)


def running_place(root: Place) -> Place:
    """Where the store's markers of running jobs are (``{tenant}`` in the store's value is ``_running``)."""
    from evalq.shared.policy.egress import tenant_place

    return Place(tenant_place(root.uri, RUNNING), root.endpoint_url)


def keep(place: Place, running: Place, job_id: str, document: str, binding: str | None = None) -> None:
    """The job's document in its folder, then its marker: a marker never names a folder without one.
    The marker, in the operator's part of the store, carries the document's digest: a tenant may write
    its own folder (a shared mount it reads with DuckDB), and a document changed there is never taken
    for the job (its namespace, destination and scheduling are the cluster's). A queue request's job
    (``binding``: its request's key, ``keys.request_binding``) is found by it too (``requested``)."""
    data = document.encode("utf-8")
    place.put(JOB_DOCUMENT, data)
    marker = json.dumps({"job_id": job_id, "place": place.as_json(), "sha256": _digest(data)}).encode("utf-8")
    if binding is not None:
        running.put(request_name(binding), marker)
    running.put(marker_name(job_id), marker)


def request_name(binding: str) -> str:
    """Where a request's marker is, beside the running jobs' (not among them: ``running_jobs`` reads
    only the folder's own files)."""
    return f"{REQUESTS}/{_digest(binding.encode('utf-8'))}.json"


def requested(root: Place, binding: str) -> tuple[str, Place, str] | None:
    """(job id, its folder, its document's digest) of the running job a queue request made, or None
    (no store marker for it, or its job has ended)."""
    running = running_place(root)
    raw = running.get(request_name(binding), missing_ok=True)
    try:
        marker = json.loads(raw) if raw is not None else None
        found = (str(marker["job_id"]), Place.from_json(marker["place"]), str(marker["sha256"])) if marker else None
    except (ValueError, KeyError, TypeError):
        return None  # not a marker evalq wrote
    return found if found is not None and running.exists(marker_name(found[0])) else None


def _digest(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def marker_name(job_id: str) -> str:
    return f"{job_id}.json"


def ended(running: dict, job_id: str, binding: str | None = None) -> None:
    """The job ended: its marker goes, and its request's (``running``: where the markers are, as the
    job's document says)."""
    place = Place.from_json(running)
    place.remove(marker_name(job_id))
    if binding is not None:
        place.remove(request_name(binding))


def running_jobs(root: Place, wanted=None) -> Iterator[tuple[str, Place, str]]:
    """(job id, its folder, its document's digest) of every job the store says runs (``wanted``: of
    those whose id it accepts; a marker is read only then)."""
    running = running_place(root)
    for name in running.names():
        if not name.endswith(".json") or (wanted is not None and not wanted(name[:-len(".json")])):
            continue
        raw = running.get(name, missing_ok=True)  # ended since it was listed: passed by
        if raw is None:
            continue
        try:
            marker = json.loads(raw)
            yield str(marker["job_id"]), Place.from_json(marker["place"]), str(marker["sha256"])
        except (ValueError, KeyError, TypeError):
            continue  # not a marker evalq wrote


def cancel(place: Place) -> None:
    """Say in the job's folder that it was cancelled (``evalq cancel``)."""
    place.put(CANCELLED, b"cancelled")


def was_cancelled(place: Place) -> bool:
    return place.exists(CANCELLED)


def document(place: Place, digest: str | None = None) -> dict | None:
    """The job's stored document from its folder (None where there is none); with ``digest`` (its
    marker's), ValueError where the document is not the one the cluster wrote."""
    raw = place.get(JOB_DOCUMENT, missing_ok=True)
    if raw is not None and digest is not None and _digest(raw) != digest:
        raise ValueError(f"{place.path_of(JOB_DOCUMENT)}: not the document the cluster wrote (its digest differs)")
    return json.loads(raw) if raw is not None else None


class Done(NamedTuple):
    """What a chunk's part says of it (an older part carries no aggregate, time or accounting: None)."""

    rows: int  # the records it counted
    part: dict | None  # its mergeable aggregate (keys.parts)
    seconds: float | None  # its time (keys.timings)
    counts: dict[str, int] | None  # what its calls added to its entry's accounting (keys.accounting)
    compute: float | None = None  # of its time, its CPU's (keys.timings' cpu:<start>)


def chunks_done(place: Place, key: str) -> dict[int, Done]:
    """Chunk start -> what its part says, of every chunk of run ``key`` whose part is in the job's
    folder: from each part's footer alone."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from evalq.shared.store.groups import CHUNKS_KEY
    from evalq.shared.store.records import ACCOUNT_KEY, FOOTER_BYTES, PART_KEY, TIME_KEY, part_name, unpacked

    folder = part_name(key, 0).rsplit("/", 1)[0]
    found = {}
    for name in place.names(folder):
        # a chunk's part, a group's, or a chunk's pending one (its group's part not written yet)
        if name.startswith(("chunk-", "pending-")) and name.endswith(".parquet"):
            tail = place.get(f"{folder}/{name}", missing_ok=True, last=FOOTER_BYTES)
            if tail is not None:
                footer = pq.read_metadata(pa.BufferReader(tail))
                kept = footer.metadata
                parts, times, accounts = (unpacked(kept, k) for k in (PART_KEY, TIME_KEY, ACCOUNT_KEY))
                chunks = unpacked(kept, CHUNKS_KEY)
                if chunks is None:  # a chunk's own part
                    found[int(name.split("-", 1)[1][:-len(".parquet")])] = _done(footer.num_rows, parts, times, accounts)
                    continue
                for start, rows in chunks.items():  # a group of chunks' part: each chunk's metadata by its start
                    found[int(start)] = _done(int(rows), *((m or {}).get(start) for m in (parts, times, accounts)))
    return found


def _done(rows: int, part: dict | None, timing: dict | None, accounting: dict | None) -> Done:
    """A chunk's ``Done`` from what its part's metadata holds of it."""
    timing = timing or {}
    return Done(rows, part, timing.get("seconds"), (accounting or {}).get("counts"), timing.get("compute"))
