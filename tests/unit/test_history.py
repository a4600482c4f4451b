"""The history store on real databases (a SQLite file, and a PostgreSQL server the tests
start), regression detection against scipy's tests, and the alert webhook against a real
HTTP listener on 127.0.0.1. No Redis or Celery: the store is fed rows as the final
callback makes them (the cluster path is tests/integration/test_history.py)."""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from scipy import stats as scipy_stats

from evalq.results import alerts, regressions
from evalq.results.history import open_store
from evalq.shared.scores import stats
from evalq.shared.job.nightly import Regression, suite_of

SETTINGS = Regression(baseline=7, min_effect=0.01, alpha=0.05)
T0 = datetime(2026, 11, 1, 2, 0, 0)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'history.sqlite'}"
    base = request.getfixturevalue("postgres_url")
    db = f"h{random.randrange(10**9)}"
    engine = sa.create_engine(base.replace("postgresql://", "postgresql+psycopg://"), isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sa.text(f"CREATE DATABASE {db}"))
    engine.dispose()
    return base.rsplit("/", 1)[0] + f"/{db}"


def run_row(job_id: str, day: int, status: str = "done", suite: str = "nightly") -> dict:
    return {"job_id": job_id, "suite": suite, "request_id": f"night-{day}", "tenant": "search", "status": status,
            "started_at": T0 + timedelta(days=day), "finished_at": T0 + timedelta(days=day, minutes=30),
            "source": "nightly.json", "dataset": "s3://b/d.jsonl", "model": "m", "out": f"/out/{day}",
            "n_instances": 3, "calls": 10, "tokens": 1000, "cost": 0.5, "error": None}


def series(items: dict[str, float], name: str = "exact_match", field: str = "mean", slot: int = 0) -> dict:
    values = list(items.values())
    n, mean = len(values), sum(values) / len(values)
    sd = (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5
    return {"slot": slot, "metric": name, "name": name, "field": field, "value": mean, "ci95": [mean - 0.1, mean + 0.1],
            "n": n, "sd": sd, "worse": regressions.worse_direction(field), "items": items}


def entry(name: str = "exact_match", slot: int = 0) -> dict:
    return {"slot": slot, "metric": name, "name": name, "parameters": json.dumps({}), "n": 40, "n_errors": 0,
            "n_skipped": 0, "calls": None, "tokens": None, "cost": None}


GOOD = {f"i{k}": float(k % 5 != 0) for k in range(40)}           # 0.8
WORSE = {f"i{k}": float(k % 5 in (1, 2)) for k in range(40)}     # 0.4, every instance no better


def test_a_run_is_kept_once_and_read_back(store_url):
    store = open_store(store_url)
    first = store.record(run_row("j1", 1), [entry()], [series(GOOD)], SETTINGS)
    again = store.record(run_row("j1", 1), [entry()], [series(WORSE)], SETTINGS)
    assert first.new and not again.new and first.regressions == again.regressions == []
    [run] = store.runs_of("nightly")
    assert run["job_id"] == "j1" and run["status"] == "done" and run["cost"] == 0.5 and run["tokens"] == 1000
    assert run["finished_at"] == "2026-11-02T02:30:00+00:00" and run["tenant"] == "search"
    [metric] = run["metrics"]
    assert metric["value"] == pytest.approx(0.8) and metric["n"] == 40 and metric["worse"] == "lower"
    assert metric["ci95"] == pytest.approx([0.7, 0.9])


def test_three_runs_only_the_worse_one_regresses(store_url):
    store = open_store(store_url)
    f1 = {f"i{k}": 0.5 + (k % 7) / 20 for k in range(40)}
    assert store.record(run_row("j1", 1), [entry(), entry("f1", 1)],
                        [series(GOOD), series(f1, "f1", slot=1)], SETTINGS).regressions == []
    assert store.record(run_row("j2", 2), [entry(), entry("f1", 1)],
                        [series(GOOD), series(f1, "f1", slot=1)], SETTINGS).regressions == []
    better_f1 = {k: v + 0.05 for k, v in f1.items()}
    got = store.record(run_row("j3", 3), [entry(), entry("f1", 1)],
                       [series(WORSE), series(better_f1, "f1", slot=1)], SETTINGS)
    [found] = got.regressions
    assert found["name"] == "exact_match" and found["paired"] and found["n"] == 40 and found["baseline_runs"] == 2
    assert found["value"] == pytest.approx(0.4) and found["baseline"] == pytest.approx(0.8)
    expected = stats.paired([GOOD[i] for i in GOOD], [WORSE[i] for i in GOOD])  # compare's paired test, directly
    assert found["delta"] == pytest.approx(expected["diff"]) and found["p_value"] == pytest.approx(expected["p_value"])
    runs = store.runs_of("nightly")
    assert [len(r["regressions"]) for r in runs] == [0, 0, 1]
    assert [r["job_id"] for r in store.runs_of("nightly", last=2)] == ["j2", "j3"]
    [suite] = store.suites()
    assert suite["runs"] == 3 and suite["last"]["job_id"] == "j3" and suite["last"]["regressions"] == 1
    [latest] = store.latest()
    assert latest["job_id"] == "j3" and {m["name"] for m in latest["metrics"]} == {"exact_match", "f1"}


def test_the_last_run_of_each_suite_and_its_last_done_one(store_url):
    store = open_store(store_url)
    store.record(run_row("j1", 1), [entry()], [series(GOOD)], SETTINGS)
    store.record(run_row("j2", 2, status="failed"), [], [], SETTINGS)
    store.record(run_row("k1", 1, status="cancelled", suite="other"), [], [], SETTINGS)
    assert [(r["suite"], r["job_id"]) for r in store.latest()] == [("nightly", "j2"), ("other", "k1")]
    [done] = store.latest("done")
    assert done["job_id"] == "j1" and done["metrics"][0]["value"] == pytest.approx(0.8)


def test_defect_rates_regress_upwards_and_failed_runs_are_no_baseline(store_url):
    store = open_store(store_url)
    clean = {f"i{k}": float(k % 10 == 0) for k in range(60)}    # 0.1
    dirty = {f"i{k}": float(k % 10 in (0, 1, 2)) for k in range(60)}  # 0.3
    store.record(run_row("j1", 1), [entry("violence")], [series(clean, "violence", "defect_rate")], SETTINGS)
    store.record(run_row("jf", 2, status="failed"), [entry("violence")], [series(dirty, "violence", "defect_rate")],
                 SETTINGS)
    lower = store.record(run_row("j2", 3), [entry("violence")], [series({k: 0.0 for k in clean}, "violence",
                                                                        "defect_rate")], SETTINGS)
    assert lower.regressions == []  # fewer defects is better, never flagged
    worse = store.record(run_row("j3", 4), [entry("violence")], [series(dirty, "violence", "defect_rate")], SETTINGS)
    [found] = worse.regressions
    assert found["field"] == "defect_rate" and found["delta"] > 0 and found["baseline_runs"] == 2


def test_a_small_move_is_no_regression(store_url):
    store = open_store(store_url)
    base = {f"i{k}": 0.5 for k in range(200)}
    store.record(run_row("j1", 1), [entry()], [series({k: v + (0.001 if int(k[1:]) % 2 else -0.001)
                                                       for k, v in base.items()})], SETTINGS)
    tiny = {k: 0.495 for k in base}  # significant (every instance moved), but under min_effect 0.01
    assert store.record(run_row("j2", 2), [entry()], [series(tiny)], SETTINGS).regressions == []
    strict = Regression(baseline=7, min_effect=0.001, alpha=0.05)
    assert len(store.record(run_row("j3", 3), [entry()], [series(tiny)], strict).regressions) == 1


def test_only_the_last_n_done_runs_are_the_baseline(store_url):
    store = open_store(store_url)
    low = {f"i{k}": float(k % 5 in (1, 2)) for k in range(40)}  # 0.4
    store.record(run_row("old", 1), [entry()], [series(GOOD)], SETTINGS)
    for day in range(2, 4):
        store.record(run_row(f"j{day}", day), [entry()], [series(low)], SETTINGS)
    # against the last 2 runs (0.4), 0.4 is no regression; against the last 3 it would be
    two = Regression(baseline=2, min_effect=0.01, alpha=0.05)
    assert store.record(run_row("j9", 9), [entry()], [series(low)], two).regressions == []


def test_unpaired_when_runs_share_no_instances(store_url):
    store = open_store(store_url)
    rng = random.Random(7)
    old = {f"a{k}": rng.gauss(0.7, 0.1) for k in range(300)}
    new = {f"b{k}": rng.gauss(0.6, 0.1) for k in range(300)}
    store.record(run_row("j1", 1), [entry("sim")], [series(old, "sim")], SETTINGS)
    [found] = store.record(run_row("j2", 2), [entry("sim")], [series(new, "sim")], SETTINGS).regressions
    assert not found["paired"]
    welch = scipy_stats.ttest_ind(list(new.values()), list(old.values()), equal_var=False)
    assert found["delta"] == pytest.approx(sum(new.values()) / 300 - sum(old.values()) / 300)
    assert found["p_value"] == pytest.approx(welch.pvalue, abs=1e-6)


def test_normal_approximations_agree_with_scipy():
    rng = random.Random(3)
    base = [rng.gauss(0.6, 0.2) for _ in range(3000)]
    new = [b - 0.01 + rng.gauss(0, 0.1) for b in base]
    delta, p = regressions.normal_paired(base, new)
    assert delta == pytest.approx(sum(new) / 3000 - sum(base) / 3000)
    assert p == pytest.approx(scipy_stats.ttest_rel(new, base).pvalue, rel=0.05)  # normal vs t tail
    s = {"n": 2500, "value": 0.58, "sd": 0.2}
    past = [{"n": 2000, "value": 0.6, "sd": 0.21}]
    got = regressions.unpaired_move(s, past)
    ref = scipy_stats.ttest_ind_from_stats(0.58, 0.2, 2500, 0.6, 0.21, 2000, equal_var=False)
    assert got[1] == pytest.approx(ref.pvalue, rel=0.05)


def test_an_older_store_is_upgraded_and_its_runs_compared_unpaired(tmp_path):
    from alembic import command
    from alembic.config import Config

    import evalq.results.migrations as migrations

    url = f"sqlite:///{tmp_path / 'old.sqlite'}"
    engine = sa.create_engine(url)
    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    with engine.begin() as conn:  # the store as the first schema made it
        config.attributes["connection"] = conn
        command.upgrade(config, "0001")
        conn.execute(sa.text("INSERT INTO runs (id, job_id, suite, status, finished_at) VALUES "
                             "(1, 'old', 'nightly', 'done', '2026-10-01 02:00:00')"))
        conn.execute(sa.text("INSERT INTO entries (run_id, slot, metric, name, parameters, n) VALUES "
                             "(1, 0, 'exact_match', 'exact_match', '{}', 40)"))
        conn.execute(sa.text("INSERT INTO entry_values (run_id, slot, field, value, n, sd, worse) VALUES "
                             "(1, 0, 'mean', 0.8, 40, 0.405, 'lower')"))
    engine.dispose()
    store = open_store(url)
    [found] = store.record(run_row("new", 40), [entry()], [series(WORSE)], SETTINGS).regressions
    assert not found["paired"] and found["baseline"] == pytest.approx(0.8)
    assert [r["job_id"] for r in store.runs_of("nightly")] == ["old", "new"]
    with sa.create_engine(url).connect() as conn:
        assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar() == "0005"


def test_the_head_evalq_knows_is_alembics_and_a_store_there_opens_without_alembic(tmp_path):
    import subprocess
    import sys

    from alembic.config import Config
    from alembic.script import ScriptDirectory

    import evalq.results.migrations as migrations
    from evalq.results.history import HEAD

    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    assert HEAD == ScriptDirectory.from_config(config).get_current_head()
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    open_store(url)  # made and migrated to the head here
    code = ("import sys; from evalq.results.history import open_store; "
            f"open_store({url!r}).runs_of('nightly'); print('alembic' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_default_suite_names():
    assert suite_of("jobs/rag-nightly.json") == "rag-nightly"
    assert suite_of("s3://bucket/jobs/rag.json.gz") == "rag"
    assert suite_of("request.job") == "default"


def test_an_alert_is_sent_once_with_retries(tmp_path, webhook, caplog):
    store = open_store(f"sqlite:///{tmp_path / 'h.sqlite'}")
    store.record(run_row("j1", 1), [entry()], [series(GOOD)], SETTINGS)
    got = store.record(run_row("j2", 2), [entry()], [series(WORSE)], SETTINGS)
    webhook.fail_first = 2
    with caplog.at_level("INFO", logger="evalq.history"):
        assert alerts.notify(store, "nightly", "j2", got.regressions)
        assert not alerts.notify(store, "nightly", "j2", got.regressions)  # a second caller sends nothing
    assert len(webhook.bodies) == 3  # two 500s retried, then delivered; never again
    body = webhook.bodies[-1]
    assert set(body) == {"suite", "job_id", "regressions", "judge_changes", "text"} and body["job_id"] == "j2"
    assert body["text"].startswith("nightly: exact_match regressed to 0.4 from 0.8") and "\n" not in body["text"]
    assert "SECRET-TOKEN" not in caplog.text
    assert store.runs_of("nightly")[-1]["alert"] == "sent"


def test_a_failing_webhook_never_raises(tmp_path, webhook, monkeypatch):
    monkeypatch.setenv("EVALQ_ALERT_ATTEMPTS", "2")
    store = open_store(f"sqlite:///{tmp_path / 'h.sqlite'}")
    store.record(run_row("j1", 1), [entry()], [series(GOOD)], SETTINGS)
    got = store.record(run_row("j2", 2), [entry()], [series(WORSE)], SETTINGS)
    webhook.fail_first = 100
    assert not alerts.notify(store, "nightly", "j2", got.regressions)
    assert len(webhook.bodies) == 2 and store.runs_of("nightly")[-1]["alert"] == "failed"


def test_stored_values_round_trip_and_older_stores_read():
    """Per-instance values are stored as compressed columns (the final callback packs a million
    in well under a second); values that older evalq stored as zlib'd JSON {id: value} read too."""
    import zlib

    from evalq.results.history import pack, unpack

    ids, values = [f"i{k}" for k in range(1000)] + ["é \\n\"x"], [k / 7 for k in range(1000)] + [0.1]
    assert unpack(pack((ids, values))) == (ids, values)
    assert unpack(pack(dict(zip(ids, values)))) == (ids, values)
    legacy = zlib.compress(json.dumps(dict(zip(ids, values))).encode(), 6)
    assert unpack(legacy) == (ids, values)


def test_an_entrys_fields_share_their_ids_when_packed_and_unpacked():
    """The fields of an entry mostly list the same instances: packed with the ids of the field
    before, and unpacked with the ids already decoded, they store and read back what each field
    alone does; a field whose instances differ gets its own."""
    from evalq.results.history import pack, unpack

    ids = [f"i{k}" for k in range(500)]
    fields = [(ids, [k / 3 for k in range(500)]), (list(ids), [k / 5 for k in range(500)]),
              (ids[:-1], [k / 7 for k in range(499)]), (list(ids), [1.0] * 500)]
    heads: list = []
    packed = [pack(f, heads) for f in fields]
    assert packed == [pack(f) for f in fields]  # the same bytes as packed one by one
    decoded: dict = {}
    back = [unpack(data, decoded) for data in packed]
    assert back == [unpack(data) for data in packed] == [(list(i), v) for i, v in fields]
    assert back[0][0] is back[1][0] is back[3][0] and back[2][0] is not back[0][0]  # decoded once
    assert len(decoded) == 2


def test_pairing_by_id_whatever_the_order_or_the_form():
    """The paired move over columns equals the one over {id: value} mappings, with baseline runs
    that list the instances in another order, miss some or have others."""
    rng = random.Random(5)
    new = {f"i{k}": rng.random() for k in range(800)}
    past = [{f"i{k}": rng.random() for k in rng.sample(range(900), 700)} for _ in range(3)]
    as_columns = [(list(p), list(p.values())) for p in past]
    by_dict = regressions.paired_move({"items": new}, [{"items": p} for p in past])
    by_columns = regressions.paired_move({"items": (list(new), list(new.values()))},
                                         [{"items": c} for c in as_columns])
    assert by_dict == pytest.approx(by_columns)
    shared = [i for i in new if any(i in p for p in past)]
    base = [sum(p[i] for p in past if i in p) / sum(i in p for p in past) for i in shared]
    delta, p_value = regressions.normal_paired(base, [new[i] for i in shared])
    assert by_dict[0] == pytest.approx(delta) and by_dict[1] == pytest.approx(p_value)
    assert by_dict[2] == pytest.approx(sum(base) / len(base)) and by_dict[4] == len(shared)


def test_a_suite_is_its_tenants_another_tenants_runs_are_no_baseline(store_url):
    """Before: one forged run in another team's suite sent its webhook a false regression, and seven
    forged low runs hid a real drop. Baselines are now chosen by suite and tenant."""
    store = open_store(store_url)
    for day in (1, 2):
        store.record(run_row(f"j{day}", day), [entry()], [series(GOOD)], SETTINGS)
    forged = {**run_row("x1", 3), "tenant": "ads"}
    assert store.record(forged, [entry()], [series({k: 0.0 for k in GOOD})], SETTINGS).regressions == []
    for day in range(4, 11):  # seven forged low runs in the same suite, from another tenant
        store.record({**run_row(f"x{day}", day), "tenant": "ads"}, [entry()], [series(WORSE)], SETTINGS)
    [found] = store.record(run_row("j11", 11), [entry()], [series(WORSE)], SETTINGS).regressions
    assert found["baseline_runs"] == 2 and found["baseline"] == pytest.approx(0.8)  # search's own nights only


def test_big_runs_pair_over_the_same_sample_of_instances(store_url):
    """Issue 59: past EVALQ_HISTORY_MAX_ITEMS a run keeps the values of a sample of its instances
    chosen by a hash of their id; the nights' samples are the same instances, so a big night is
    still paired with its baseline, over the sample, with n, value and sd of every item."""
    from evalq.results.recording import Moments, in_sample, one_series

    big_good = {f"i{k}": float(k % 5 != 0) for k in range(4000)}
    big_worse = {f"i{k}": float(k % 5 in (1, 2)) for k in range(4000)}
    keep = in_sample(0.1)

    def sampled(items: dict[str, float], slot: int = 0) -> dict:
        moments = Moments()
        for v in items.values():
            moments.add(v)
        kept = {i: v for i, v in items.items() if keep(i)}
        return one_series(slot, {"id": "exact_match"}, "exact_match", "mean", "mean", {},
                          (list(kept), list(kept.values())), moments=moments)

    store = open_store(store_url)
    store.record(run_row("b1", 1), [entry()], [sampled(big_good)], SETTINGS)
    night = sampled(big_worse)
    assert night["n"] == 4000 and night["value"] == pytest.approx(0.4)  # every item's, not the sample's
    assert 300 < len(night["items"][0]) < 500
    [found] = store.record(run_row("b2", 2), [entry()], [night], SETTINGS).regressions
    assert found["paired"] and found["n"] == len(night["items"][0])  # the pairs: the sample, the same instances
    kept = [i for i in big_good if keep(i)]
    expected = stats.paired([big_good[i] for i in kept], [big_worse[i] for i in kept])
    assert found["delta"] == pytest.approx(expected["diff"], abs=1e-9)
