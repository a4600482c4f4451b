"""A judge that changed between two runs of a suite: a marked break in its history (issue 61), and,
where ``evalq migrate-judge`` measured the new judge against the old one first (issue 75), the break
carries that measure: the agreement of the two judges on the calibration sample, and each one's with
people.

``evalq migrate-judge`` keeps each entry's measure in ``judge_migrations`` (suite, entry, the two
judges' names and models); a later run whose entry's judge changed from the old model to the new one
finds the last such measure of its suite and entry, and the change says it (``evalq history``'s
``JUDGE CHANGED`` line, the alert)."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import sqlalchemy as sa

from evalq.results.history_tables import entries, judge_migrations, runs


def judge_changes(conn: sa.Connection, run: dict, run_id: int, entry_rows: list[dict]) -> dict[int, dict]:
    """Per slot of ``entry_rows`` whose judge is not the one the same entry (metric and name) had in
    the suite's last earlier run of the tenant that had it: what it was, what it is, and the migration
    measured between the two (``migration``, where one was)."""
    judged = [e for e in entry_rows if e.get("judge_id")]
    if not judged:
        return {}
    tenant = runs.c.tenant.is_(None) if run.get("tenant") is None else \
        sa.or_(runs.c.tenant == run["tenant"], runs.c.tenant.is_(None))
    rows = conn.execute(
        sa.select(entries.c.metric, entries.c.name, entries.c.judge, entries.c.judge_id)
        .join(runs, runs.c.id == entries.c.run_id)
        .where(runs.c.suite == run["suite"], tenant, runs.c.id != run_id,
               runs.c.finished_at <= run["finished_at"], entries.c.judge_id.is_not(None))
        .order_by(runs.c.finished_at.desc(), runs.c.id.desc())).all()
    last: dict[tuple[str, str], tuple[str, str]] = {}
    for row in rows:
        last.setdefault((row.metric, row.name), (row.judge_id, row.judge))
    out = {}
    for e in judged:
        before = last.get((e["metric"], e["name"]))
        if before is not None and before[0] != e["judge_id"]:
            change = {"metric": e["metric"], "name": e["name"],
                      "before": json.loads(before[1]) if before[1] else {"id": before[0]},
                      "after": json.loads(e["judge"]) if e.get("judge") else {"id": e["judge_id"]}}
            measured = migration_for(conn, run["suite"], change)
            if measured is not None:
                change["migration"] = measured
            out[e["slot"]] = change
    return out


def migration_for(conn: sa.Connection, suite: str, change: dict) -> dict | None:
    """The last migration measured in ``suite`` for the change's entry from its old judge's model to
    its new one's."""
    old, new = change["before"].get("model"), change["after"].get("model")
    if not old or not new:
        return None
    row = conn.execute(sa.select(judge_migrations.c.agreement, judge_migrations.c.job_id,
                                 judge_migrations.c.recorded_at, judge_migrations.c.from_judge,
                                 judge_migrations.c.to_judge)
                       .where(judge_migrations.c.suite == suite, judge_migrations.c.name == change["name"],
                              judge_migrations.c.from_model == old, judge_migrations.c.to_model == new)
                       .order_by(judge_migrations.c.recorded_at.desc(), judge_migrations.c.id.desc()).limit(1)).first()
    if row is None:
        return None
    return {"from": row.from_judge, "to": row.to_judge, "job_id": row.job_id,
            "measured_at": row.recorded_at.isoformat(timespec="seconds") + "+00:00", **json.loads(row.agreement)}


def change_of(entry: dict) -> dict:
    """An entry whose judge changed, as the alert and ``evalq history`` show it."""
    out = {"metric": entry["metric"], "name": entry["name"], "before": json.loads(entry["judge_before"]),
           "after": json.loads(entry["judge"]) if entry.get("judge") else {"id": entry.get("judge_id")}}
    if entry.get("judge_migration"):
        out["migration"] = json.loads(entry["judge_migration"])
    return out


def record_migration(engine: sa.Engine, suite: str, job_id: str, old: tuple[str, str], new: tuple[str, str],
                     rows: list[dict]) -> int:
    """Keep what ``evalq migrate-judge`` measured, per entry (``old``, ``new``: each judge's name and
    model): how many entries were kept."""
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    kept = 0
    with engine.begin() as conn:
        for row in rows:
            agreement = {"n": row.get("n"), "agreement": row.get("agreement"), "means": row.get("means"),
                         "with_people": row.get("with_people")}
            conn.execute(judge_migrations.insert().values(
                suite=suite, name=row["entry"], from_judge=old[0], from_model=old[1], to_judge=new[0], to_model=new[1],
                agreement=json.dumps(agreement), job_id=job_id, recorded_at=now))
            kept += 1
    return kept


def migration_words(measured: dict) -> str:
    """A migration's measure in words: the new judge against the old on the sample."""
    got = measured.get("agreement") or {}

    def num(v) -> str:
        return f"{v:.2f}" if isinstance(v, (int, float)) else "-"

    return (f"measured before the switch (evalq migrate-judge, {measured.get('measured_at', '')[:10]}): "
            f"{measured.get('to')} against {measured.get('from')} on {measured.get('n')} items, exact "
            f"{num(got.get('exact'))}, within one {num(got.get('within_1'))}, alpha {num(got.get('alpha'))}")
