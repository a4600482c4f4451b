"""Arrow columns and Parquet reads that leave pandas out of the process.

``pa.array`` over a Python list asks pyarrow's pandas shim whether the list is pandas-like, and
``pq.read_table`` goes through ``pyarrow.dataset``: either imports pandas where it is installed
(0.27 s of CPU and some 50 MB in every process that writes or reads a part: each pool process of
a worker, each ``evalq run``; issue 76). Columns built from their buffers, a table from its
arrays and reads through ``ParquetFile`` do not, and hold the same values
(tests/unit/test_store_columns.py).
"""

from __future__ import annotations

import array
import itertools
from typing import Any, Iterable


def int64s(values: Iterable[int]) -> Any:
    import pyarrow as pa

    buf = array.array("q", values)
    return pa.Array.from_buffers(pa.int64(), len(buf), [None, pa.py_buffer(buf)])


def strings(values: Iterable[str | None]) -> Any:
    """A ``string`` column (None: null)."""
    import pyarrow as pa

    encoded = [None if v is None else v.encode("utf-8") for v in values]
    try:
        offsets = array.array("i", itertools.accumulate((0 if b is None else len(b) for b in encoded), initial=0))
    except OverflowError:  # 2 GiB of text in one column: pyarrow's own conversion chunks it
        return pa.array([None if b is None else b.decode("utf-8") for b in encoded], pa.string())
    validity, nulls = _validity(encoded)
    data = pa.py_buffer(b"".join(b for b in encoded if b is not None))
    return pa.Array.from_buffers(pa.string(), len(encoded), [validity, pa.py_buffer(offsets), data],
                                 null_count=nulls)


def _bitmap(flags: list[bool]) -> Any:
    """Arrow's bit-packed booleans (least significant bit first), as a buffer."""
    import pyarrow as pa

    bits = bytearray((len(flags) + 7) // 8)
    for i, flag in enumerate(flags):
        if flag:
            bits[i >> 3] |= 1 << (i & 7)
    return pa.py_buffer(bytes(bits))


def _validity(values: list) -> tuple[Any, int]:
    """A column's validity bitmap (None where no value is null) and its count of nulls."""
    nulls = values.count(None)
    return (_bitmap([v is not None for v in values]) if nulls else None), nulls


def float64s(values: Iterable[float | None]) -> Any:
    """A ``double`` column (None: null)."""
    import pyarrow as pa

    values = list(values)
    validity, nulls = _validity(values)
    buf = array.array("d", (0.0 if v is None else v for v in values))
    return pa.Array.from_buffers(pa.float64(), len(values), [validity, pa.py_buffer(buf)], null_count=nulls)


def bools(values: Iterable[bool | None]) -> Any:
    """A ``bool`` column (None: null)."""
    import pyarrow as pa

    values = list(values)
    validity, nulls = _validity(values)
    return pa.Array.from_buffers(pa.bool_(), len(values), [validity, _bitmap([bool(v) for v in values])],
                                 null_count=nulls)


def table(columns: dict[str, Any]) -> Any:
    """A table of named columns (``int64s``, ``strings``, ``float64s``, ``bools``)."""
    import pyarrow as pa

    return pa.Table.from_arrays(list(columns.values()), names=list(columns))


def read(data: bytes, columns: list[str] | None = None) -> Any:
    """A whole Parquet part (``columns`` of it) as a table."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pq.ParquetFile(pa.BufferReader(data)).read(columns=columns)


def typed(record: dict) -> tuple[float | None, str | None, bool | None]:
    """(score, label, passed) of a record, each where its result has one: ``score`` a result that is
    a number, or its ``score`` field (a rating, a rubric); ``label`` a result that is a string, or its
    ``label``; ``passed`` a result that is a boolean, or its ``passed``."""
    result = record.get("result")
    fields = result if isinstance(result, dict) else {}
    score = result if _real(result) else fields.get("score")
    label = result if isinstance(result, str) else fields.get("label")
    passed = result if isinstance(result, bool) else fields.get("passed")
    return (float(score) if _real(score) else None, label if isinstance(label, str) else None,
            passed if isinstance(passed, bool) else None)


def _real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value  # not NaN
