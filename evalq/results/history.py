"""The history store: every job that ended, kept in a SQL database, grouped into series by suite.

The final callback records each ended job once (``evalq.results.recording``); ``evalq
history`` and the jobs role's Prometheus gauges read it. SQLAlchemy Core over:

- SQLite by default: ``$EVALQ_CACHE_DIR/history.sqlite`` (``~/.cache/evalq/history.sqlite``),
  which embedded runs and ``evalq history`` on the same machine share;
- any SQLAlchemy URL in ``EVALQ_HISTORY_URL``, e.g. PostgreSQL for a cluster
  (``postgresql://user:pw@host/db`` is read as psycopg 3's ``postgresql+psycopg://``).
``EVALQ_HISTORY=off`` records nothing.

Tables (Alembic migrations in ``migrations/``; opening a store upgrades it to this evalq's
schema, under a lock, so a newer evalq opens an older store):

    runs          one row per job (unique job_id): suite, request, tenant, status, times,
                  dataset, model, where the outputs are, calls, tokens, cost, alert state
    entries       per (run, entry slot): metric id, name, parameters, n, errors, judge spend, and
                  for a judge's entry who judged it (its identity, id, and the identity it changed from)
    entry_values  per (run, slot, field): the value results.json reports, its ci95, n, the
                  items' standard deviation and which way is worse
    item_values   per (run, slot, field): the per-instance values (pairing by id), compressed
                  columns (``pack``; older stores' zlib'd JSON {instance id: value} read too)
    regressions   per (run, slot, field) found worse than the suite's baseline
"""

from __future__ import annotations

import json
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import sqlalchemy as sa

from evalq.shared.core.errors import EvalqError, InfraError
from evalq.shared.job.nightly import Regression
from evalq.results.item_columns import pack, unpack  # noqa: F401  (the stored form of per-instance values)
from evalq.results.history_tables import (
    REGRESSION_FIELDS, entries, entry_values, item_values, regressions, run_versions, runs)
from evalq.results.dataset_versions import Against, against, name_examples, stored_change
from evalq.results.judge_breaks import change_of, judge_changes
from evalq.results.labels import agreements
from evalq.shared.data.versions import Version
from evalq.shared.scores.stats import columns


class HistoryOff(EvalqError):
    """``EVALQ_HISTORY=off``: nothing is recorded, there is nothing to read."""


def history_url() -> str | None:
    """The store's SQLAlchemy URL from the environment; None when history is off."""
    if os.environ.get("EVALQ_HISTORY", "").strip().lower() in ("off", "0", "false", "no"):
        return None
    url = os.environ.get("EVALQ_HISTORY_URL", "").strip()
    if url:
        return normalized(url)
    from evalq.shared.core.config import cache_dir

    return f"sqlite:///{cache_dir() / 'history.sqlite'}"


def normalized(url: str) -> str:
    """``postgresql://`` and ``postgres://`` mean psycopg 3 (the driver evalq installs)."""
    for plain in ("postgresql://", "postgres://"):
        if url.startswith(plain):
            return "postgresql+psycopg://" + url[len(plain):]
    return url


def safe(url: str) -> str:
    """The URL fit to print: no password."""
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001  (an unparsable URL is printed as nothing of it)
        return "<unparsable URL>"


_engines: dict[tuple[int, str], sa.Engine] = {}
_upgraded: set[tuple[int, str]] = set()
_lock = threading.Lock()


def open_store(url: str | None = None) -> "HistoryStore":
    """The store at ``url`` (default: from the environment), its schema brought up to date."""
    url = normalized(url) if url else history_url()
    if url is None:
        raise HistoryOff("history is off (EVALQ_HISTORY=off)")
    key = (os.getpid(), url)  # engines hold connections: never share one across a fork
    with _lock:
        if key not in _engines:
            _engines[key] = _engine(url)
        engine = _engines[key]
        if key not in _upgraded:
            _upgrade(engine, url)
            _upgraded.add(key)
    return HistoryStore(engine)


def _engine(url: str) -> sa.Engine:
    try:
        parsed = sa.engine.make_url(url)
    except sa.exc.ArgumentError:
        raise InfraError(f"EVALQ_HISTORY_URL: not a database URL: {safe(url)}") from None
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(url, connect_args={"timeout": 30})

        @sa.event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record) -> None:  # several processes write one file
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()
        return engine
    return sa.create_engine(url, pool_pre_ping=True, pool_size=2, max_overflow=2)


@contextmanager
def _migration_lock(engine: sa.Engine, conn: sa.Connection):
    """One process migrates at a time: a PostgreSQL advisory lock, a file lock beside a SQLite file."""
    if engine.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(20261124)"))
        yield
    elif engine.dialect.name == "sqlite" and engine.url.database not in (None, "", ":memory:"):
        import fcntl

        with open(f"{Path(engine.url.database).expanduser()}.lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
    else:
        yield


# The newest migration's revision (evalq/results/migrations/versions): a store already there needs no
# migration, and is opened without importing alembic (0.12 s of a cold process's first record,
# with mako and pygments). tests/unit/test_history.py holds it equal to alembic's own head.
HEAD = "0005"


def _at_head(engine: sa.Engine) -> bool:
    """Whether the store's schema is this evalq's: its ``alembic_version`` holds ``HEAD`` alone
    (a store being migrated meanwhile, a newer one, or none: False, and alembic decides)."""
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars().all() == [HEAD]
    except sa.exc.SQLAlchemyError:
        return False


def _upgrade(engine: sa.Engine, url: str, revision: str = "head") -> None:
    if revision == "head" and _at_head(engine):
        return
    from alembic import command
    from alembic.config import Config
    from alembic.util import CommandError

    config = Config()
    config.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    try:
        with engine.begin() as conn, _migration_lock(engine, conn):
            config.attributes["connection"] = conn
            command.upgrade(config, revision)
    except CommandError as exc:
        raise InfraError(f"history store {safe(url)}: {exc} (is it from a newer evalq?)") from None
    except sa.exc.SQLAlchemyError as exc:
        raise InfraError(f"history store {safe(url)}: {type(exc).__name__}: {str(exc).splitlines()[0]}") from None


def utc(text: str | None) -> datetime | None:
    """A stored time (naive UTC) from an ISO time."""
    if not text:
        return None
    value = datetime.fromisoformat(text)
    return value.astimezone(timezone.utc).replace(tzinfo=None) if value.tzinfo else value


def iso(value: datetime | None) -> str | None:
    return value.replace(tzinfo=timezone.utc).isoformat(timespec="seconds") if value else None


@dataclass
class Recorded:
    """What recording a job gave: its regressions, whether this call stored it, its alert state, and
    the entries whose judge changed since the suite's last run (never regressions: a marked break)."""

    job_id: str
    regressions: list[dict]
    new: bool
    alert: str | None
    judge_changes: list = ()


class HistoryStore:
    def __init__(self, engine: sa.Engine):
        self.engine = engine

    # -- writing ---------------------------------------------------------------
    def record(self, run: dict, entry_rows: list[dict], series: list[dict], settings: Regression,
               found: list[dict] | None = None, version: Version | None = None, said: dict | None = None) -> Recorded:
        """Store a run once (by job id): its entries, their values and, for a run that ended
        done, the regressions against the suite's baseline (``found``: as ``foresee`` found them, else
        found now), its dataset ``version``'s table and how its data differs from the baseline's (``said``,
        ``evalq.results.dataset_versions``). A second call (a redelivered callback) stores nothing and
        returns what the first stored."""
        try:
            with self.engine.begin() as conn:
                if conn.execute(sa.select(runs.c.id).where(runs.c.job_id == run["job_id"])).first():
                    return self._recorded(conn, run["job_id"])
                run_id = conn.execute(runs.insert().values(**run, alert="none")).inserted_primary_key[0]
                if version is not None and version.table:
                    conn.execute(run_versions.insert().values(run_id=run_id, rate=version.rate, data=version.table))
                changes = judge_changes(conn, run, run_id, entry_rows)
                if entry_rows:
                    conn.execute(entries.insert(), [
                        {"judge": None, "judge_id": None, **e, "run_id": run_id,
                         "judge_before": json.dumps(changes[e["slot"]]["before"]) if e["slot"] in changes else None,
                         "judge_migration": json.dumps(changes[e["slot"]]["migration"])
                         if changes.get(e["slot"], {}).get("migration") else None}
                        for e in entry_rows])
                if series:
                    conn.execute(entry_values.insert(), [
                        {"run_id": run_id, **{k: s[k] for k in ("slot", "field", "value", "n", "sd", "worse")},
                         "ci_low": (s.get("ci95") or [None, None])[0], "ci_high": (s.get("ci95") or [None, None])[1]}
                        for s in series])
                    heads: list = []  # an entry's fields mostly list the same instances: their ids encoded once
                    packed = [{"run_id": run_id, "slot": s["slot"], "field": s["field"],
                               "data": pack(s["items"], heads)} for s in series if s.get("items")]
                    if packed:
                        conn.execute(item_values.insert(), packed)
                if run["status"] != "done" or not series:
                    found = []
                elif found is None:
                    found, _, said = self._detect(conn, run, run_id, entry_rows, series, settings, version)
                if said:
                    conn.execute(runs.update().where(runs.c.id == run_id).values(dataset_change=stored_change(said)))
                if found:
                    conn.execute(regressions.insert(), [{"run_id": run_id, "slot": f["slot"],
                                                         **{k: f[k] for k in REGRESSION_FIELDS}} for f in found])
                said = list(changes.values())
                if found or said:
                    conn.execute(runs.update().where(runs.c.id == run_id).values(alert="pending"))
                return Recorded(run["job_id"], [_public(f) for f in found], True,
                                "pending" if found or said else "none", said)
        except sa.exc.IntegrityError:  # another process recorded it between our read and write
            with self.engine.connect() as conn:
                return self._recorded(conn, run["job_id"])

    def foresee(self, run: dict, entry_rows: list[dict], series: list[dict], settings: Regression,
                version: Version | None = None) -> tuple[list[dict], int, dict | None]:
        """What ``record`` would find of ``run`` (as if it ended done), stored nowhere: its regressions
        (with their ``slot``), how many earlier runs had a value to compare with and how its data
        differs from the baseline's (``evalq.results.dataset_versions``; the report says all three)."""
        if not series:
            return [], 0, None
        with self.engine.connect() as conn:  # (a callback run again: the run it recorded is not its own baseline)
            earlier = conn.execute(sa.select(runs.c.id).where(runs.c.job_id == run["job_id"])).scalar()
            return self._detect(conn, run, -1 if earlier is None else earlier, entry_rows, series, settings, version)

    def baseline_items(self, run: dict, series: list[dict], settings: Regression, version: Version | None = None):
        """What ``foresee`` compares ``run`` with, per (metric, name, field): the baseline runs' rows."""
        with self.engine.connect() as conn:
            earlier = conn.execute(sa.select(runs.c.id).where(runs.c.job_id == run["job_id"])).scalar()
            return self._baseline(conn, run, -1 if earlier is None else earlier, series, settings.baseline, None,
                                  version, settings.dataset)[0]

    def _detect(self, conn: sa.Connection, run: dict, run_id: int, entry_rows: list[dict], series: list[dict],
                settings: Regression, version: Version | None = None) -> tuple[list[dict], int, dict | None]:
        from evalq.results.regressions import detect

        judged = {e["slot"]: e.get("judge_id") for e in entry_rows}
        past, chosen = self._baseline(conn, run, run_id, series, settings.baseline, judged, version, settings.dataset)
        return (detect(series, past, settings), len({p["run_id"] for rows in past.values() for p in rows}),
                chosen.said)

    def _recorded(self, conn: sa.Connection, job_id: str) -> Recorded:
        row = conn.execute(sa.select(runs.c.id, runs.c.alert).where(runs.c.job_id == job_id)).one()
        found = conn.execute(sa.select(regressions).where(regressions.c.run_id == row.id)
                             .order_by(regressions.c.slot, regressions.c.field)).mappings().all()
        changed = conn.execute(sa.select(entries).where(entries.c.run_id == row.id, entries.c.judge_before.is_not(None))
                               .order_by(entries.c.slot)).mappings().all()
        return Recorded(job_id, [_public(dict(f)) for f in found], False, row.alert,
                        [change_of(dict(e)) for e in changed])

    def _baseline(self, conn: sa.Connection, run: dict, run_id: int, series: list[dict], how_many: int,
                  judged: dict[int, str | None] | None = None, version: Version | None = None,
                  pin: str | None = None) -> tuple[dict[tuple[str, str, str], list[dict]], Against]:
        """Per (metric, name, field) of ``series``: what each of the suite's last ``how_many``
        runs of the same tenant that ended done before this one has of it (value, n, sd, and its
        items if kept), where the entry was judged by the same judge (``judged``: this run's judge
        id per slot; a run an older store kept without one counts for any), on the same dataset
        ``version`` or else over the items shared unchanged (``pin``: a pinned version's runs;
        ``evalq.results.dataset_versions``); and the runs chosen."""
        # a suite is its tenant's: another tenant's runs of the same name are never its baseline
        # (runs an older store kept without a tenant count for any)
        tenant = runs.c.tenant.is_(None) if run.get("tenant") is None else \
            sa.or_(runs.c.tenant == run["tenant"], runs.c.tenant.is_(None))
        chosen = against(conn, sa.select(runs.c.id, runs.c.job_id, runs.c.dataset_digest, runs.c.n_instances)
                         .where(runs.c.suite == run["suite"], tenant, runs.c.status == "done",
                                runs.c.id != run_id, runs.c.finished_at <= run["finished_at"])
                         .order_by(runs.c.finished_at.desc(), runs.c.id.desc()), how_many, version, pin)
        earlier = chosen.runs
        if not earlier:
            return {}, chosen
        wanted = {(s["metric"], s["name"], s["field"]): (judged or {}).get(s["slot"]) for s in series}
        rows = conn.execute(
            sa.select(entries.c.run_id, entries.c.slot, entries.c.metric, entries.c.name, entry_values.c.field,
                      entry_values.c.value, entry_values.c.n, entry_values.c.sd, item_values.c.data,
                      entries.c.judge_id)
            .join(entry_values, sa.and_(entry_values.c.run_id == entries.c.run_id,
                                        entry_values.c.slot == entries.c.slot))
            .outerjoin(item_values, sa.and_(item_values.c.run_id == entry_values.c.run_id,
                                            item_values.c.slot == entry_values.c.slot,
                                            item_values.c.field == entry_values.c.field))
            .where(entries.c.run_id.in_(earlier))).all()
        found: dict[tuple[str, str, str], list[dict]] = {}
        names: list = []  # the baseline's instance ids, to name the ones removed
        heads: dict = {}  # a run's fields mostly list the same instances: their ids decoded once
        for row in rows:
            key = (row.metric, row.name, row.field)
            if key not in wanted or (wanted[key] and row.judge_id and row.judge_id != wanted[key]):
                continue  # not this run's, or judged by another judge: a break, never a baseline
            if row.value is not None:
                items = unpack(row.data, heads) if row.data else None
                keep = chosen.keep.get(row.run_id)
                if items is not None:
                    names.append(items[0])
                    if keep is not None:  # another version's run: its items shared unchanged only
                        items = tuple(map(list, zip(*[(i, v) for i, v in zip(*items) if keep(i)]))) or ([], [])
                found.setdefault(key, []).append({"run_id": row.run_id, "value": row.value, "n": row.n, "sd": row.sd,
                                                  "items": items, "unpaired": row.run_id in chosen.unpaired})
        name_examples(chosen, [columns(s["items"])[0] for s in series if s.get("items")] + names)
        return found, chosen

    def claim_alert(self, job_id: str) -> bool:
        """True for the one caller that moves the run's alert from pending to sending."""
        with self.engine.begin() as conn:
            done = conn.execute(runs.update().where(runs.c.job_id == job_id, runs.c.alert == "pending")
                                .values(alert="sending"))
            return done.rowcount == 1

    def set_alert(self, job_id: str, state: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(runs.update().where(runs.c.job_id == job_id).values(alert=state))

    # -- reading ---------------------------------------------------------------
    def runs_of(self, suite: str, last: int | None = None) -> list[dict]:
        """The suite's runs, oldest first (the last ``last`` of them), as ``evalq history --json`` shows them."""
        with self.engine.connect() as conn:
            query = sa.select(runs).where(runs.c.suite == suite).order_by(runs.c.finished_at.desc(), runs.c.id.desc())
            rows = conn.execute(query.limit(last) if last else query).mappings().all()[::-1]
            return self._documents(conn, rows)

    def latest(self, status: str | None = None) -> list[dict]:
        """Each suite's last run per tenant (a suite is its tenant's; of that ``status``, or any), as
        ``runs_of`` shows runs."""
        with self.engine.connect() as conn:
            last = sa.select(runs.c.suite, sa.func.max(runs.c.id).label("id")).group_by(runs.c.suite, runs.c.tenant)
            if status is not None:
                last = last.where(runs.c.status == status)
            last = last.subquery()
            rows = conn.execute(sa.select(runs).join(last, runs.c.id == last.c.id)
                                .order_by(runs.c.suite, runs.c.tenant)).mappings().all()
            return self._documents(conn, rows)

    def suites(self) -> list[dict]:
        """Every suite (per tenant) with its number of runs and its last run (without its metrics)."""
        with self.engine.connect() as conn:
            counts = {(suite, tenant): n for suite, tenant, n in conn.execute(
                sa.select(runs.c.suite, runs.c.tenant, sa.func.count()).group_by(runs.c.suite, runs.c.tenant)).all()}
        out = []
        for doc in self.latest():
            out.append({"suite": doc["suite"], "tenant": doc["tenant"], "runs": counts.get((doc["suite"], doc["tenant"]), 0),
                        "last": {k: doc[k] for k in ("job_id", "status", "finished_at", "cost")}
                        | {"regressions": len(doc["regressions"])}})
        return out

    def _documents(self, conn: sa.Connection, rows) -> list[dict]:
        ids = [row["id"] for row in rows]
        if not ids:
            return []
        heads = {(e["run_id"], e["slot"]): e for e in conn.execute(
            sa.select(entries).where(entries.c.run_id.in_(ids))).mappings()}
        values: dict[int, list[dict]] = {}
        for v in conn.execute(sa.select(entry_values).where(entry_values.c.run_id.in_(ids))
                              .order_by(entry_values.c.slot, entry_values.c.field)).mappings():
            head = heads[(v["run_id"], v["slot"])]
            values.setdefault(v["run_id"], []).append({
                "metric": head["metric"], "name": head["name"], "field": v["field"],
                "parameters": json.loads(head["parameters"]), "value": v["value"],
                "ci95": [v["ci_low"], v["ci_high"]] if v["ci_low"] is not None else None, "n": v["n"],
                "n_errors": head["n_errors"], "worse": v["worse"],
                **({"judge": json.loads(head["judge"])} if head.get("judge") else {}),
                **({"judge_changed": change_of(dict(head))} if head.get("judge_before") else {})})
        people = agreements(conn, ids)  # the judges against people's labels (evalq.results.labels)
        found: dict[int, list[dict]] = {}
        for f in conn.execute(sa.select(regressions).where(regressions.c.run_id.in_(ids))
                              .order_by(regressions.c.slot, regressions.c.field)).mappings():
            found.setdefault(f["run_id"], []).append(_public(dict(f)))
        return [{"suite": row["suite"], "job_id": row["job_id"], "request_id": row["request_id"],
                 "tenant": row["tenant"], "status": row["status"], "started_at": iso(row["started_at"]),
                 "finished_at": iso(row["finished_at"]), "dataset": row["dataset"], "model": row["model"],
                 "out": row["out"], "error": row["error"], "cost": row["cost"], "tokens": row["tokens"],
                 "calls": row["calls"], "alert": row["alert"], "n_instances": row["n_instances"],
                 "dataset_digest": row["dataset_digest"],
                 "dataset_change": json.loads(row["dataset_change"]) if row["dataset_change"] else None,
                 "metrics": values.get(row["id"], []), "people": people.get(row["id"], {}),
                 "regressions": found.get(row["id"], [])} for row in rows]


def _public(found: dict) -> dict:
    return {k: found[k] for k in REGRESSION_FIELDS}
