"""Input limits: a job file or dataset comes from someone else, so its size,
its lines and its nesting are bounded before they can exhaust a process.

Settings (environment, bytes unless said):

- ``EVALQ_MAX_JOB_BYTES`` (default 256 MiB): a job file, or a ``json``/``harpia``
  dataset read whole, after decompression;
- ``EVALQ_MAX_RECORD_BYTES`` (default 16 MiB): one line of a JSON Lines dataset;
- ``EVALQ_MAX_DATASET_BYTES`` (default 64 GiB): a JSON Lines dataset after
  decompression (a small gzip "bomb" that inflates without end stops here);
- ``EVALQ_MAX_JSON_DEPTH`` (default 64): nesting of any JSON value read.

Every job document is read through ``evalq.shared.data.documents``, which applies these.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from evalq.shared.core.config import env_number

MiB = 1 << 20


@dataclass(frozen=True)
class Limits:
    job_bytes: int
    record_bytes: int
    dataset_bytes: int
    json_depth: int

    @classmethod
    def from_env(cls) -> "Limits":
        return cls(job_bytes=env_number("EVALQ_MAX_JOB_BYTES", 256 * MiB),
                   record_bytes=env_number("EVALQ_MAX_RECORD_BYTES", 16 * MiB),
                   dataset_bytes=env_number("EVALQ_MAX_DATASET_BYTES", 64 * 1024 * MiB),
                   json_depth=env_number("EVALQ_MAX_JSON_DEPTH", 64))


def size(n: int) -> str:
    """``n`` bytes as a person reads them: three figures at most ("3.06 MiB", "97.7 KiB", "512 MiB")."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", 1 << 10)):
        if n >= scale:
            value = n / scale
            return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return f"{n} bytes"


class OverLimit(ValueError):
    """JSON that is well-formed but beyond what evalq reads."""


class TooDeep(OverLimit):
    pass


class NumberTooLong(OverLimit):
    pass


def loads(text: str | bytes, depth: int) -> Any:
    """``json.loads`` that refuses nesting deeper than ``depth`` (TooDeep) instead of
    recursing until Python gives up, and numbers of more digits than Python converts
    (NumberTooLong); JSONDecodeError and UnicodeDecodeError as usual."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise TooDeep(f"JSON nested deeper than {depth} levels (EVALQ_MAX_JSON_DEPTH)") from None
    except json.JSONDecodeError:
        raise
    except UnicodeDecodeError:
        raise
    except ValueError as exc:  # Python's int-string conversion limit (4300 digits)
        raise NumberTooLong(f"a number with too many digits ({str(exc).split(':')[0]})") from None
    if too_deep(value, depth):
        raise TooDeep(f"JSON nested deeper than {depth} levels (EVALQ_MAX_JSON_DEPTH)")
    return value


def too_deep(value: Any, limit: int) -> bool:
    """Whether containers nest deeper than ``limit``, one level at a time (every record of a
    dataset passes here: a list per level is twice as fast as a stack of (item, level) pairs)."""
    level = [value] if isinstance(value, _CONTAINERS) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        below: list = []
        for item in level:
            below += [c for c in (item.values() if isinstance(item, dict) else item) if isinstance(c, _CONTAINERS)]
        level = below
    return False


_CONTAINERS = (dict, list)

