"""The job store's Parquet columns, built from their buffers (evalq.shared.store.columns): the same
values as pyarrow's own conversion, and no pandas in a process that writes and reads parts."""

from __future__ import annotations

import io
import random
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from evalq.shared.store import columns


def _texts(n: int, seed: int) -> list[str | None]:
    rng = random.Random(seed)
    alphabet = "ab z\n\"\\é漢🙂\x00"
    return [None if rng.random() < 0.2 else "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))
            for _ in range(n)]


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 1000])
def test_a_string_column_equals_pyarrows_own(n):
    values = _texts(n, seed=n)
    built = columns.strings(values)
    built.validate(full=True)
    reference = pa.array(values, pa.string())
    assert built.equals(reference)
    assert built.null_count == reference.null_count
    assert built.to_pylist() == values


def test_an_int64_column_equals_pyarrows_own():
    values = [0, -1, 2**62, -(2**63), 41] + list(range(1000))
    assert columns.int64s(values).equals(pa.array(values, pa.int64()))
    assert columns.int64s([]).equals(pa.array([], pa.int64()))


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 1000])
def test_double_and_bool_columns_equal_pyarrows_own(n):
    rng = random.Random(n)
    doubles = [None if rng.random() < 0.2 else rng.uniform(-1e6, 1e6) for _ in range(n)]
    flags = [None if rng.random() < 0.2 else rng.random() < 0.5 for _ in range(n)]
    for built, reference in ((columns.float64s(doubles), pa.array(doubles, pa.float64())),
                             (columns.bools(flags), pa.array(flags, pa.bool_()))):
        built.validate(full=True)
        assert built.equals(reference) and built.null_count == reference.null_count
    assert columns.float64s(doubles).to_pylist() == doubles and columns.bools(flags).to_pylist() == flags


def test_a_table_written_and_read_back_keeps_its_values_and_metadata():
    values = _texts(300, seed=3)
    table = columns.table({"position": columns.int64s(range(300)), "text": columns.strings(values)})
    table = table.replace_schema_metadata({b"k": b"v"})
    out = io.BytesIO()
    pq.write_table(table, out, compression="zstd", row_group_size=64)
    back = columns.read(out.getvalue())
    assert back.equals(pq.read_table(pa.BufferReader(out.getvalue())))
    assert back.schema.metadata == {b"k": b"v"}
    assert columns.read(out.getvalue(), ["text"]).column_names == ["text"]


def test_a_non_text_value_is_refused():
    with pytest.raises(AttributeError):
        columns.strings(["a", 3])


def test_writing_and_reading_parts_leaves_pandas_out(tmp_path):
    # pandas is installed here (the test extras); through pa.array or pq.read_table each process
    # that writes a part would import it
    code = f"""
import sys
from evalq.shared.store import instances, records
from evalq.shared.store.place import Place
place = Place({str(tmp_path)!r})
staged = instances.stage(place, ['{{"id": "a"}}', '{{"id": "b"}}'])
assert instances.staged_lines(staged, 0, 2) == ['{{"id": "a"}}', '{{"id": "b"}}']
data = records._encode([(0, {{"instance_id": "a", "category": None, "score": 1.0}})], {{records.VALUES_KEY: {{"x": 1}}}})
assert list(records._decode(data)) == [0]
assert "pyarrow" in sys.modules
print("pandas" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_a_records_score_label_and_passed_are_read_where_its_result_has_them():
    from evalq.shared.store.records import typed

    assert typed({"result": 0.25}) == (0.25, None, None)  # bleu, a number
    assert typed({"result": 1}) == (1.0, None, None)  # exact_match
    assert typed({"result": {"score": 4, "reason": "clear"}}) == (4.0, None, None)  # a judge's rating
    assert typed({"result": {"score": 0.5, "label": "partial", "passed": False}}) == (0.5, "partial", False)
    assert typed({"result": "toxic"}) == (None, "toxic", None) and typed({"result": True}) == (None, None, True)
    assert typed({"result": {"f1": 0.5, "precision": 1.0}}) == (None, None, None)  # fields: read with json
    assert typed({"result": float("nan")}) == (None, None, None)
    assert typed({"error": "MetricError: no reply"}) == (None, None, None)
    assert typed({"result": {"score": True, "label": 3, "passed": 1}}) == (None, None, None)  # not their kinds
