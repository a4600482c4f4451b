"""The stored form of a series' per-instance values (the history store's ``item_values``): columns of
instance ids and float64 values, compressed, the ids of an entry's fields encoded once."""

from __future__ import annotations

import json
import struct
import zlib

from evalq.shared.scores.stats import Items, columns

_COLUMNS = b"EVQI2"  # item_values' columnar form: zlib(<u32 n><n bytes: JSON list of ids><float64s>)


def pack(items: Items, heads: list | None = None) -> bytes:
    """A series' per-instance values as stored: the ids (JSON) and the values (little-endian
    float64), compressed; a million values pack in well under a second. ``heads``: the last
    (ids, JSON) packed, kept there so that the fields of an entry, which mostly list the same
    instances, encode their ids once."""
    import numpy as np

    ids, values = columns(items)
    if heads and heads[0][0] == ids:
        head = heads[0][1]
    else:
        head = json.dumps(list(ids), separators=(",", ":"), ensure_ascii=False).encode()
        if heads is not None:
            heads[:] = [(ids, head)]
    body = struct.pack("<I", len(head)) + head + np.asarray(values, dtype="<f8").tobytes()
    return _COLUMNS + zlib.compress(body, 1)


def unpack(data: bytes, heads: dict | None = None) -> tuple[list[str], list[float]]:
    """Stored values as columns (ids, values); values stored by older evalq (zlib'd JSON
    ``{id: value}``, which never starts with the columnar mark) are read too. ``heads``: ids
    already decoded, by their JSON, filled here, so that the fields of a run decode theirs once
    (the lists are shared: read them, do not change them)."""
    import numpy as np

    if data.startswith(_COLUMNS):
        raw = zlib.decompress(data[len(_COLUMNS):])
        (n,) = struct.unpack_from("<I", raw)
        head = raw[4:4 + n]
        ids = heads.get(head) if heads is not None else None
        if ids is None:
            ids = json.loads(head)
            if heads is not None:
                heads[head] = ids
        return ids, np.frombuffer(raw[4 + n:], dtype="<f8").tolist()
    return columns(json.loads(zlib.decompress(data)))
