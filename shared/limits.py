"""Input limits: a job file or dataset comes from someone else, so its size,
its lines and its nesting are bounded before they can exhaust a process.

Settings (environment, bytes unless said):

- ``EVALQ_MAX_JOB_BYTES`` (default 256 MiB): a job file, or a ``json``/``harpia``
  dataset read whole, after decompression;
- ``EVALQ_MAX_RECORD_BYTES`` (default 16 MiB): one line of a JSON Lines dataset;
- ``EVALQ_MAX_DATASET_BYTES`` (default 64 GiB): a JSON Lines dataset after
  decompression (a small gzip "bomb" that inflates without end stops here);
- ``EVALQ_MAX_JSON_DEPTH`` (default 64): nesting of any JSON value read.

Every job document (a job file, a ``job_uri`` on S3, an inline ``job`` in a
queue request, a ``json``/``harpia`` dataset; gzipped or not) is read by
``read_document`` / ``check_inline``: the stored size is checked before
reading, the decompressed size while reading, then the nesting; every
failure is a ``JobError`` naming the source, never a traceback.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from evalq.shared.config import env_number

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
    for unit, scale in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
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
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            if level > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return False


def parse_document(data: str | bytes, source: str, depth: int | None = None) -> Any:
    """A JSON document's value; every way it can be unreadable is a JobError naming ``source``."""
    from evalq.shared.errors import JobError

    depth = Limits.from_env().json_depth if depth is None else depth
    try:
        return loads(data, depth)
    except json.JSONDecodeError as exc:
        raise JobError(f"{source}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
    except UnicodeDecodeError as exc:
        raise JobError(f"{source}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OverLimit as exc:
        raise JobError(f"{source}: {exc}") from None


def read_document(uri: str, endpoint_url: str | None = None, hint: str = "") -> Any:
    """The JSON document at ``uri`` (a local path or ``s3://``, gzipped or not), bounded by
    ``EVALQ_MAX_JOB_BYTES`` before and after decompression and by ``EVALQ_MAX_JSON_DEPTH``."""
    from evalq.shared.errors import JobError
    from evalq.shared.storage import open_binary

    limits = Limits.from_env()
    with open_binary(uri, endpoint_url, max_bytes=limits.job_bytes, limit_name="EVALQ_MAX_JOB_BYTES") as stream:
        try:
            data = stream.read(limits.job_bytes + 1)
        except (OSError, EOFError) as exc:  # a truncated or corrupt gzip stream
            raise JobError(f"{uri}: cannot read: {exc}") from None
    if len(data) > limits.job_bytes:
        raise JobError(f"{uri}: larger than {size(limits.job_bytes)} once decompressed (EVALQ_MAX_JOB_BYTES)"
                       + (f"; {hint}" if hint else ""))
    return parse_document(data, uri, limits.json_depth)


def check_inline(value: Any, source: str) -> None:
    """An inline document (a queue request's ``job``, already decoded by the broker's
    JSON): the same bounds as a file, its size measured as compact JSON."""
    from evalq.shared.errors import JobError

    limits = Limits.from_env()
    if too_deep(value, limits.json_depth):
        raise JobError(f"{source}: JSON nested deeper than {limits.json_depth} levels (EVALQ_MAX_JSON_DEPTH)")
    encoded = 0
    for piece in json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).iterencode(value):
        encoded += len(piece.encode("utf-8"))
        if encoded > limits.job_bytes:
            raise JobError(f"{source}: larger than {size(limits.job_bytes)} (EVALQ_MAX_JOB_BYTES); put the "
                           "instances in a JSON Lines dataset, which is streamed")
