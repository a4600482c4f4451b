"""Dataset versions (issue 75): the digest of a job's validated instances, the table that says which
instances two versions share unchanged, and the history store choosing a night's baseline by them:
the same version when an earlier run has it, else the items shared unchanged (the difference said),
or a pinned version. The history store is a real SQLite file; the expected sets are counted here
from the instances themselves, not from evalq's output."""

from __future__ import annotations

import random

import pytest

from evalq.results.dataset_versions import dataset_line
from evalq.results.history import open_store
from evalq.shared.data.versions import VersionCounter, change, in_sample
from evalq.shared.job.nightly import Regression
from tests.unit.test_history import SETTINGS, entry, run_row, series


def instances(n: int, changed: set[int] = frozenset(), start: int = 0) -> list[dict]:
    return [{"id": f"q{k}", "input": f"question {k}" + (" (reworded)" if k in changed else ""),
             "expected-output": [f"answer {k}"], "actual-output": f"tonight's answer {k}", "context": [f"passage {k}"]}
            for k in range(start, n)]


def counted(items: list[dict], fields=None) -> VersionCounter:
    counter = VersionCounter(fields)
    for inst in items:
        counter.add(inst)
    return counter


def test_the_digest_is_of_the_test_cases_in_any_order_not_of_tonights_answers():
    base = counted(instances(50)).version()
    shuffled = instances(50)
    random.Random(3).shuffle(shuffled)
    assert counted(shuffled).version().digest == base.digest and base.n == 50
    answered = [{**i, "actual-output": "another model's answer", "context": ["retrieved again"],
                 "human": {"coherence": 4}} for i in instances(50)]
    assert counted(answered).version().digest == base.digest
    reordered_keys = [dict(reversed(list(i.items()))) for i in instances(50)]
    assert counted(reordered_keys).version().digest == base.digest
    assert counted(instances(50, changed={7})).version().digest != base.digest
    assert counted(instances(51)).version().digest != base.digest
    # a job that names the fields: only they (and the id) make the version
    only_refs = counted(instances(50, changed={7}), ["expected-output"]).version()
    assert only_refs.digest == counted(instances(50), ["expected-output"]).version().digest
    assert counted(instances(50), ["expected-output", "context"]).version().digest != only_refs.digest


def test_the_change_between_two_versions_is_counted_from_the_ids():
    old = instances(115)
    new = [i for i in instances(125, changed={3, 8, 40}) if i["id"] not in ("q11", "q12")]
    moved = change(counted(new).version().table, 1.0, counted(old).version().table, 1.0)
    old_ids, new_ids = {i["id"] for i in old}, {i["id"] for i in new}
    from evalq.shared.data.versions import id_hash

    assert sorted(moved.added) == sorted(id_hash(i) for i in new_ids - old_ids)  # q115..q124
    assert sorted(moved.removed) == sorted(id_hash(i) for i in old_ids - new_ids)  # q11, q12
    assert sorted(moved.changed) == sorted(id_hash(f"q{k}") for k in (3, 8, 40))
    assert len(moved.unchanged) == len(old_ids & new_ids) - 3
    assert moved.counts() == {"added": 10, "removed": 2, "changed": 3, "about": False}


def test_a_sampled_table_holds_the_historys_sample_and_counts_scale():
    rate = 0.25
    keep = in_sample(rate)
    version = counted(instances(4000)).version(rate)
    assert len(version.table) // 16 == sum(keep(f"q{k}") for k in range(4000))  # exactly the instances whose values are kept
    moved = change(counted(instances(4000, changed=set(range(0, 4000, 10)))).version(rate).table, rate,
                   version.table, rate)
    assert moved.counts()["about"] and abs(moved.counts()["changed"] - 400) < 120  # 400 changed, seen in a quarter
    assert len(moved.changed) == sum(keep(f"q{k}") for k in range(0, 4000, 10))


def record(store, job_id: str, day: int, items: list[dict], values: dict[str, float], settings=SETTINGS):
    version = counted(items).version()
    run = {**run_row(job_id, day), "n_instances": len(items), "dataset_digest": version.digest}
    found, runs, said = store.foresee(run, [entry()], [series(values)], settings, version)
    recorded = store.record(run, [entry()], [series(values)], settings, found=found, version=version, said=said)
    return recorded, said, runs


@pytest.fixture
def store(tmp_path):
    return open_store(f"sqlite:///{tmp_path / 'history.sqlite'}")


def test_a_moved_dataset_is_compared_on_its_shared_unchanged_items(store):
    v1 = instances(40)
    good = {i["id"]: float(k % 5 != 0) for k, i in enumerate(v1)}  # 0.8
    record(store, "n1", 1, v1, good)
    recorded, said, runs = record(store, "n2", 2, v1, good)
    assert said["compared_on"] == "same version" and said["added"] == said["changed"] == 0 and runs == 1
    # night 3: 10 added and 8 changed; the changed (and added) items all fail tonight, the shared
    # unchanged ones score as before: compared on those, no regression
    changed = {k for k in range(0, 40, 5)} | {1, 2, 3}
    v2 = instances(50, changed=changed)
    tonight = {i["id"]: (0.0 if int(i["id"][1:]) in changed or int(i["id"][1:]) >= 40 else good[i["id"]]) for i in v2}
    assert sum(tonight.values()) / len(tonight) < 0.8 - 0.2  # a mean over all items would regress
    recorded, said, runs = record(store, "n3", 3, v2, tonight)
    assert recorded.regressions == [] and runs == 2
    assert said["compared_on"] == "shared items" and said["baseline"]["job_id"] == "n2"
    assert (said["added"], said["removed"], said["changed"]) == (10, 0, len(changed))
    assert said["shared"] == 40 - len(changed)
    assert set(said["examples"]["added"]) <= {f"q{k}" for k in range(40, 50)} and len(said["examples"]["added"]) == 5
    assert set(said["examples"]["changed"]) <= {f"q{k}" for k in changed}
    line = dataset_line(said)
    assert "10 added, 0 removed, 11 changed" in line and f"on the {40 - len(changed)} items shared unchanged" in line
    [doc] = [r for r in store.runs_of("nightly") if r["job_id"] == "n3"]
    assert doc["dataset_change"]["changed"] == len(changed) and doc["dataset_digest"] == counted(v2).version().digest
    # night 4, same data as night 3, a shared item's drop regresses: its baseline is night 3 alone
    worse = {**tonight, **{f"q{k}": 0.0 for k in range(4, 40) if k not in changed}}
    recorded, said, runs = record(store, "n4", 4, v2, worse)
    assert said["compared_on"] == "same version" and runs == 1 and said["baseline"]["job_id"] == "n3"
    [found] = recorded.regressions
    assert found["paired"] and found["n"] == 50


def test_on_other_data_a_regression_is_found_on_the_shared_items_and_never_unpaired(store):
    v1 = instances(40)
    good = {i["id"]: float(k % 5 != 0) for k, i in enumerate(v1)}
    record(store, "n1", 1, v1, good)
    v2 = instances(40, changed=set(range(20)))  # half changed: 20 shared unchanged
    worse = {i["id"]: 0.0 if int(i["id"][1:]) >= 20 else good[i["id"]] for i in v2}
    recorded, said, _ = record(store, "n2", 2, v2, worse)
    [found] = recorded.regressions
    assert found["paired"] and found["n"] == 20  # the shared items' pairs only
    shared = [good[f"q{k}"] for k in range(20, 40)]
    assert found["baseline"] == pytest.approx(sum(shared) / 20)
    # all items changed: no pair, and a mean over other data is not compared
    v3 = instances(40, changed=set(range(40)))
    v3 = [{**i, "input": i["input"] + " again"} for i in v3]
    recorded, said, _ = record(store, "n3", 3, v3, {i["id"]: 0.0 for i in v3})
    assert recorded.regressions == [] and said["shared"] == 0 and said["changed"] == 40


def test_a_pinned_version_is_the_baseline_whatever_ran_since(store):
    v1, v2 = instances(40), instances(40, changed={1, 2})
    good = {i["id"]: float(k % 5 != 0) for k, i in enumerate(v1)}
    record(store, "n1", 1, v1, good)
    record(store, "n2", 2, v2, {i: 0.0 for i in good})  # another version, everything failed
    pin = counted(v1).version().digest[:10]
    pinned = Regression(**{**SETTINGS.model_dump(), "dataset": pin})
    recorded, said, runs = record(store, "n3", 3, v2, good, pinned)
    assert runs == 1 and said["baseline"]["job_id"] == "n1" and said["compared_on"] == "pinned version"
    assert said["changed"] == 2 and recorded.regressions == []
    assert "against the pinned version" in dataset_line(said)
    nothing = Regression(**{**SETTINGS.model_dump(), "dataset": "0123456789abcdef"})
    recorded, said, runs = record(store, "n4", 4, v2, good, nothing)
    assert runs == 0 and "baseline" not in said and recorded.regressions == []
    assert dataset_line(said).endswith("no earlier run of the suite on the pinned version 0123456789abcdef")


def test_runs_an_older_store_kept_without_a_digest_are_compared_as_before(store):
    good = {f"q{k}": float(k % 5 != 0) for k in range(40)}
    store.record(run_row("old", 1), [entry()], [series(good)], SETTINGS)  # no digest, no table
    recorded, said, runs = record(store, "new", 2, instances(40), {k: 0.0 for k in good})
    assert runs == 1 and said["baseline"]["digest"] is None and recorded.regressions
    assert "not known" in dataset_line(said)
