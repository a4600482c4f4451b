"""JSON in the forms evalq stores in Redis, at the speed of the C codec.

``json.dumps(value, ensure_ascii=False)`` builds a new encoder on every call that passes an
option (a third of the cost of a small record), and ``json.loads`` of one stored value at a time
pays Python's wrapper per value (two thirds of decoding a small instance); on a fast metric's
chunk path both were paid per item (BENCHMARKS.md, "Fast metrics through evalq")."""

from __future__ import annotations

import base64
import json
from typing import Any

_ENCODER = json.JSONEncoder(ensure_ascii=False)


def _c_encode(sort_keys: bool = False):
    """The C encoder ``JSONEncoder.encode`` builds afresh on every call (about 1 us, as much as
    encoding a small record), made once. Made without the circular-reference check, whose
    bookkeeping is per call: it holds no state, so it is safe from any thread (a value that
    contains itself raises RecursionError rather than ValueError). None where CPython's C codec
    is missing or its signature differs."""
    from json.encoder import c_make_encoder, encode_basestring

    if c_make_encoder is None:
        return None
    try:
        iterencode = c_make_encoder(None, _ENCODER.default, encode_basestring, None, ": ", ", ",
                                    sort_keys, False, True)
        sample = {"b": [1, 2.5, None, True, "é\n"], "a": {"c": float("nan")}}
        if "".join(iterencode(sample, 0)) != (_SORTED if sort_keys else _ENCODER).encode(sample):
            return None
    except TypeError:
        return None
    join = "".join

    def encode(value: Any) -> str:
        if isinstance(value, str):  # as JSONEncoder.encode: a bare string is not a container
            return encode_basestring(value)
        return join(iterencode(value, 0))

    return encode


_SORTED = json.JSONEncoder(ensure_ascii=False, sort_keys=True)
# the text json.dumps(value, ensure_ascii=False) gives
encode = _c_encode() or _ENCODER.encode
# ... and json.dumps(value, ensure_ascii=False, sort_keys=True): the same value whatever its keys' order
encode_sorted = _c_encode(sort_keys=True) or _SORTED.encode


def decode_many(raw: list) -> list[Any]:
    """``[json.loads(r) for r in raw]``, decoded as one array in one call (``raw``: all bytes, or all str)."""
    if not raw:
        return []
    if isinstance(raw[0], str):
        return json.loads("[" + ",".join(raw) + "]")
    return json.loads(b"[" + b",".join(raw) + b"]")


def pack_floats(values: list) -> str:
    """A column of numbers as a chunk stores it for the report and the history store: its
    little-endian float64s (None as NaN) in base64, as the history store keeps a series' values
    (``evalq.results.history.pack``). Their JSON costs a ``repr`` a number (a toxicity chunk's
    seven labels: 16 of its 50 ms of writing); this costs a twelfth of that and half the text, and
    ``unpack_floats`` gives the same floats back."""
    import numpy as np

    return base64.b64encode(np.asarray(values, dtype="<f8").tobytes()).decode("ascii")


def unpack_floats(text: str, none: bool = False) -> list:
    """What ``pack_floats`` packed; with ``none``, NaN read as None (for a column that holds no
    NaN of its own)."""
    import numpy as np

    out = np.frombuffer(base64.b64decode(text), dtype="<f8").tolist()
    return [None if v != v else v for v in out] if none else out
