"""Job documents, read one way on every path: a job file, a ``job_uri`` on S3, an
inline ``job`` in a queue request, a ``json``/``harpia`` dataset; gzipped or not.

The stored size is checked before reading (``EVALQ_MAX_JOB_BYTES``), the
decompressed size while reading, then the nesting (``EVALQ_MAX_JSON_DEPTH``) and
numbers Python cannot convert; every failure is a ``JobError`` naming the
source, never a traceback.
"""

from __future__ import annotations

import json
from typing import Any

from evalq.shared.core.errors import JobError
from evalq.shared.core.limits import Limits, OverLimit, loads, size, too_deep
from evalq.shared.data.storage import open_binary


def parse_document(data: str | bytes, source: str, depth: int | None = None) -> Any:
    """A JSON document's value; every way it can be unreadable is a JobError naming ``source``."""
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
    limits = Limits.from_env()
    if too_deep(value, limits.json_depth):
        raise JobError(f"{source}: JSON nested deeper than {limits.json_depth} levels (EVALQ_MAX_JSON_DEPTH)")
    encoded = 0
    for piece in json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).iterencode(value):
        encoded += len(piece.encode("utf-8"))
        if encoded > limits.job_bytes:
            raise JobError(f"{source}: larger than {size(limits.job_bytes)} (EVALQ_MAX_JOB_BYTES); put the "
                           "instances in a JSON Lines dataset, which is streamed")
