"""A chunk's report sample and history values are stored as packed float64 columns
(``jsonio.pack_floats``, under ``sample_f64`` and ``fields_f64``): the final callback reads from a
real Redis what the report and the history store read before, whether the chunks were written
packed or, by an older worker, as plain JSON lists, and both kinds mixed in one entry; and a final
callback of an older evalq finds ``sample`` and ``fields`` empty rather than packed text."""

from __future__ import annotations

import json
import random

import pytest
import redis

import evalq.shared.job.catalogue  # noqa: F401  (registers the metrics)
from evalq.results.recording import chunk_values, item_fields
from evalq.results.report import ReportBuilder, chunk_view
from evalq.shared.cluster import keys
from evalq.shared.core.jsonio import encode, unpack_floats
from evalq.shared.metrics.registry import REGISTRY
from evalq.shared.scores.results import read

LABELS = ["toxicity", "severe_toxicity", "insult"]


def chunks(n: int = 300, size: int = 100):
    rng = random.Random(3)
    items = []
    for i in range(n):
        result = {label: rng.random() ** 3 for label in LABELS}
        if i % 7 == 0:
            del result["insult"]  # a field some items lack: None in its column
        items.append((i, {"instance_id": f"t{i}", "result": result}))
    kind = REGISTRY.get("toxicity").aggregation
    readings = [read(kind, {}, rec) for _, rec in items]
    return [(items[s:s + size], readings[s:s + size], s) for s in range(0, n, size)], n, kind


def older(packed: dict, none: bool = False) -> dict:
    """The lists an older worker wrote instead of the packed columns."""
    return {name: unpack_floats(text, none=none) for name, text in packed.items()}


def test_history_values_read_back_packed_and_plain_mixed(redis_url):
    r = redis.Redis.from_url(redis_url)
    parts, n, kind = chunks(size=30)  # ten chunks: their order in Redis's hash is not theirs by chance
    job = "columns-test-values"
    r.delete(keys.values(job, "tox@0"))
    expected: dict[str, tuple[list, list]] = {}
    written = [(k, *part) for k, part in enumerate(parts)]
    random.Random(8).shuffle(written)  # chunks finish in any order
    for k, items, readings, start in written:
        values = chunk_values(items, readings)
        assert values["fields"] == {} and set(values["fields_f64"]) == set(LABELS)  # an older reader: no values
        if k == 1:  # one chunk as an older worker wrote it
            values = {"ids": values["ids"], "fields": older(values["fields_f64"], none=True)}
        r.hset(keys.values(job, "tox@0"), str(start), encode(values))
    for items, readings, _ in parts:
        for (_, rec), reading in zip(items, readings):
            for field, value in reading.values.items():
                ids, vals = expected.setdefault(field, ([], []))
                ids.append(rec["instance_id"])
                vals.append(value)
    got = item_fields(r, job, "tox@0", kind, {}, chunks=len(parts))
    # in position order, whatever order the chunks were written in: runs pair without a lookup
    assert got == expected
    assert len(expected["insult"][0]) == n - len(range(0, n, 7))
    r.delete(keys.values(job, "tox@0"))


def test_history_values_from_records_come_in_position_order(redis_url):
    """Without every chunk's kept values (a chunk of an older worker), the items are read from
    their records, which Redis hands back in any order: they come in position order too."""
    r = redis.Redis.from_url(redis_url)
    parts, n, kind = chunks()
    job = "columns-test-records"
    r.delete(keys.results(job, "tox@0"), keys.values(job, "tox@0"))
    records = [(p, rec) for items, _, _ in parts for p, rec in items]
    random.Random(9).shuffle(records)
    r.hset(keys.results(job, "tox@0"), mapping={str(p): encode(rec) for p, rec in records})
    got = item_fields(r, job, "tox@0", kind, {}, chunks=len(parts))  # no chunk kept its values
    for label in LABELS:
        want = [(rec["instance_id"], rec["result"][label]) for _, rec in sorted(records) if label in rec["result"]]
        assert list(zip(*got[label])) == want
    r.delete(keys.results(job, "tox@0"))


def test_report_samples_read_back_packed_and_plain_mixed():
    parts, n, _ = chunks()
    summary = [{"metric": "toxicity", "name": "toxicity", "aggregation": "toxicity"}]
    views = [json.loads(encode(chunk_view(items, readings, n, start))) for items, readings, start in parts]
    assert all(v["sample"] == {} and set(v["sample_f64"]) == set(LABELS) for v in views)
    old = {k: v for k, v in views[0].items() if k != "sample_f64"} | {"sample": older(views[0]["sample_f64"])}
    builder = ReportBuilder(summary, {})
    builder.add_views(0, [old, *views[1:]])
    for label in LABELS:
        want = [reading.sample[label] for _, readings, _ in parts for reading in readings if label in reading.sample]
        assert sorted(builder.samples[0][label]) == sorted(want)


def test_a_big_runs_history_keeps_a_sample_by_instance_id_and_moments_of_every_item(redis_url):
    """Issue 59: the final callback's memory must not grow with N. Past EVALQ_HISTORY_MAX_ITEMS the
    history keeps the values of a sample of instances chosen by a hash of their id: the same
    instances in every run (a smaller rate's sample inside a bigger one's), while n, mean and
    standard deviation are over every item, as numpy computes them."""
    import numpy as np

    from evalq.results.recording import Moments, entry_series, in_sample, sample_rate

    r = redis.Redis.from_url(redis_url)
    parts, n, kind = chunks(n=3000, size=100)
    job = "columns-test-sample"
    r.delete(keys.values(job, "tox@0"))
    for items, readings, start in parts:
        r.hset(keys.values(job, "tox@0"), str(start), encode(chunk_values(items, readings)))
    every = entry_series(r, job, "tox@0", kind, {}, chunks=len(parts))
    half = entry_series(r, job, "tox@0", kind, {}, chunks=len(parts), rate=0.5)
    tenth = entry_series(r, job, "tox@0", kind, {}, chunks=len(parts), rate=0.1)
    for label in LABELS:
        (all_ids, all_values), moments = every[label]
        values = np.asarray(all_values)
        for (ids, _), m in (half[label], tenth[label]):
            assert (m.n, m.binary) == (len(values), False)
            assert m.total / m.n == pytest.approx(values.mean()) and m.sd == pytest.approx(values.std(ddof=1))
        (half_ids, half_values), _ = half[label]
        (tenth_ids, _), _ = tenth[label]
        assert set(tenth_ids) <= set(half_ids) <= set(all_ids)  # the same instances, nested
        assert 0.4 < len(half_ids) / len(all_ids) < 0.6 and 0.06 < len(tenth_ids) / len(all_ids) < 0.14
        by_id = dict(zip(all_ids, all_values))
        assert [by_id[i] for i in half_ids] == half_values  # each kept value is the item's, in order
    assert in_sample(1.0) is None and in_sample(0.3)("t7") == in_sample(0.3)("t7")
    assert sample_rate({"n_instances": 50}) == 1.0
    assert sample_rate({"n_instances": 400_000}) == pytest.approx(0.25)  # 100,000 by default
    one = Moments()
    for v in (1.0, 0.0, 1.0):
        one.add(v)
    assert one.binary and one.sd == pytest.approx(np.std([1.0, 0.0, 1.0], ddof=1))
    r.delete(keys.values(job, "tox@0"))
