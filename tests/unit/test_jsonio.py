"""evalq's one JSON encoder (``evalq.shared.core.jsonio``) writes exactly what
``json.dumps(value, ensure_ascii=False)`` writes, the form every stored instance and record
takes, and decoding many stored values at once gives what decoding each gives."""

from __future__ import annotations

import json
import threading

import pytest

from evalq.shared.core import jsonio

VALUES = ["plain", "é, ü and \u2028 \"quoted\" \\ \n", "", 0, -7, 10**30, 2.5, -0.0, 1e-300, 1 / 3,
          float("nan"), float("inf"), float("-inf"), None, True, False, [], {}, (1, "two"),
          {"instance_id": "q-1", "result": {"toxicity": 0.125, "labels": ["a", "b"]}, "human": None},
          {1: "an int key", 2.5: "a float key", None: "a None key", True: "a bool key"},
          [[[[{"deep": ["ü"]}]]]]]


@pytest.mark.parametrize("value", VALUES, ids=[repr(v)[:30] for v in VALUES])
def test_encode_writes_what_json_dumps_writes(value):
    assert jsonio.encode(value) == json.dumps(value, ensure_ascii=False)


def test_what_json_cannot_write_is_refused_as_json_refuses_it():
    with pytest.raises(TypeError, match="not JSON serializable"):
        jsonio.encode({"result": object()})
    with pytest.raises(TypeError):
        json.dumps({"result": object()})


def test_one_encoder_from_many_threads():
    values = [{"instance_id": f"i{n}", "result": n / 7, "text": "ü" * (n % 13)} for n in range(2000)]
    expected = [json.dumps(v, ensure_ascii=False) for v in values]
    got: dict[int, list[str]] = {}

    def run(k: int) -> None:
        got[k] = [jsonio.encode(v) for v in values]

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(got[k] == expected for k in range(4))


def test_without_the_c_codec_the_python_encoder_is_used(monkeypatch):
    import json.encoder

    monkeypatch.setattr(json.encoder, "c_make_encoder", None)
    assert jsonio._c_encode() is None  # then ``encode`` is JSONEncoder.encode, the same text


def test_decode_many_decodes_each_value():
    raw = [json.dumps(v, ensure_ascii=False).encode() for v in VALUES if v == v and v not in (float("inf"),
                                                                                             float("-inf"))]
    assert jsonio.decode_many(raw) == [json.loads(r) for r in raw]
    assert jsonio.decode_many([]) == []


# --- columns of numbers: a chunk's report sample and history values -----------------------------

COLUMN = [0.0, -0.0, 1.0, 1 / 3, 2.5e-308, 5e-324, 1e308, -7.25, 0.1 + 0.2, 3]


def test_a_packed_column_reads_back_the_same_floats():
    back = jsonio.unpack_floats(json.loads(jsonio.encode(jsonio.pack_floats(COLUMN))))
    assert back == [float(v) for v in COLUMN]
    assert [str(v) for v in back] == [str(float(v)) for v in COLUMN]  # -0.0 and the last bits kept
    nan = jsonio.unpack_floats(jsonio.pack_floats([float("nan"), float("inf"), float("-inf")]))
    assert nan[0] != nan[0] and nan[1:] == [float("inf"), float("-inf")]
    assert jsonio.unpack_floats(jsonio.pack_floats([])) == []


def test_none_comes_back_where_asked():
    column = [None, 0.5, None, -1.0]
    assert jsonio.unpack_floats(jsonio.pack_floats(column), none=True) == column
    back = jsonio.unpack_floats(jsonio.pack_floats(column))
    assert back[0] != back[0] and back[1] == 0.5  # NaN where None was, unless asked


def test_a_packed_column_is_shorter_than_its_json():
    values = [(i * 0.7919) % 1 for i in range(1000)]
    assert len(jsonio.encode(jsonio.pack_floats(values))) < 0.7 * len(jsonio.encode(values))
