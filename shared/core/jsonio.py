"""JSON in the forms evalq stores in Redis, at the speed of the C codec.

``json.dumps(value, ensure_ascii=False)`` builds a new encoder on every call that passes an
option (a third of the cost of a small record), and ``json.loads`` of one stored value at a time
pays Python's wrapper per value (two thirds of decoding a small instance); on a fast metric's
chunk path both were paid per item (BENCHMARKS.md, "Fast metrics through evalq")."""

from __future__ import annotations

import json
from typing import Any

# the text json.dumps(value, ensure_ascii=False) gives, from one encoder made once (stateless:
# safe from any thread)
encode = json.JSONEncoder(ensure_ascii=False).encode


def decode_many(raw: list[bytes]) -> list[Any]:
    """``[json.loads(r) for r in raw]``, decoded as one array in one call."""
    return json.loads(b"[" + b",".join(raw) + b"]") if raw else []
