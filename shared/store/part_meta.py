"""What names a job's record parts and what their metadata carries (``evalq.shared.store.records``;
the groups of chunks, ``evalq.shared.store.groups``, read and write them too)."""

from __future__ import annotations

import zlib

VALUES_KEY = b"evalq.values"  # the part's metadata key of the chunk's history values (JSON, zlib'd)
VIEW_KEY = b"evalq.view"  # and of its report view (JSON, zlib'd)
PART_KEY = b"evalq.part"  # and of its mergeable aggregate (what keys.parts holds of it)
TIME_KEY = b"evalq.elapsed"  # and of its time ({"seconds": ..., "compute": ...}: what keys.timings holds of it)
ACCOUNT_KEY = b"evalq.accounting"  # and of its calls' accounting ({"counts": what keys.accounting adds up})
CARRIED = (VALUES_KEY, VIEW_KEY, PART_KEY, TIME_KEY, ACCOUNT_KEY)  # what a chunk's part carries besides its records


def part_name(key: str, start: int) -> str:
    from urllib.parse import quote

    return f"records/entry={quote(key, safe='')}/chunk-{start:09d}.parquet"


def unpacked(meta: dict | None, name: bytes) -> dict | None:
    """What a part's metadata (``meta``, as its footer gives it) carries under ``name``, or None."""
    import json

    packed = (meta or {}).get(name)
    return json.loads(zlib.decompress(packed)) if packed is not None else None
