"""People's labels of a night's judged items, back in the history store, and the judge's agreement
with them per night (issue 75).

People label where they already look: Phoenix span annotations (``annotator_kind`` ``HUMAN``) and
MLflow assessments (source ``HUMAN``) on the spans and traces evalq scored, or a file from any other
tool (``evalq.results.label_sources`` reads each). A label is matched to the item it grades by the ids
the night's log lines carry (``otel``: the judged span and its trace), or a file's instance id, and
named by the entry's name (the annotation name evalq's own scores carry there). Each lands once in
the history store's ``labels`` (by its source's id: an annotation edited in Phoenix is updated, not
added), with who labelled it and when.

Agreement, per night and judge entry, from the pairs (the judge's score of an item, a person's label
of it), one pair per item and person: exact and within-one agreement, and Krippendorff's alpha
(ordinal, from the coincidence matrix: ``evalq.shared.judging.panel.ordinal_alpha``, equal to the
``krippendorff`` package's); a panel's members each against the same labels. A defect entry's score
and labels count as defect or not (its ``threshold``). An alpha below the bound (``--min-alpha``,
``EVALQ_LABELS_MIN_ALPHA``, 0.667) over at least ``EVALQ_LABELS_MIN_N`` pairs (20) is alerted like a
regression, once per night and entry.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Iterator

import sqlalchemy as sa

from evalq.results.history_tables import label_agreement, labels, runs
from evalq.shared.core.errors import JobError

TRUE_WORDS = {"pass", "true", "yes", "correct", "good", "ok"}
FALSE_WORDS = {"fail", "false", "no", "incorrect", "bad"}


@dataclass(frozen=True)
class Label:
    """One person's label of one item: ``job_id`` the night whose answer it grades (None: the latest
    run of the suite that judged the instance), ``value`` a number (a rating, or 1/0 for a verdict)."""

    instance_id: str
    name: str
    value: float
    annotator: str
    source: str
    source_id: str
    labelled_at: datetime | None = None
    job_id: str | None = None


def number(value: Any) -> float | None:
    """A label's value as a number: a finite number, a boolean or a verdict word as 1/0, else None."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        text = value.strip().lower()
        if text in TRUE_WORDS:
            return 1.0
        if text in FALSE_WORDS:
            return 0.0
        try:
            got = float(text)
        except ValueError:
            return None
        return got if math.isfinite(got) else None
    return None


def when(text: Any) -> datetime | None:
    """A time a source gave (ISO text, or epoch milliseconds) as naive UTC; None if it gave none."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return datetime.fromtimestamp(text / 1000.0, timezone.utc).replace(tzinfo=None)
    if not isinstance(text, str) or not text:
        return None
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return value.astimezone(timezone.utc).replace(tzinfo=None) if value.tzinfo else value


FILE_FIELDS = ("instance_id", "name", "value", "annotator", "labelled_at", "job_id")


def read_file(path: Path) -> list[Label]:
    """Labels from a JSON Lines or CSV file (by its extension: ``.csv``, else JSON Lines): each line or row
    ``instance_id``, ``name`` (the entry's name), ``value`` (a number, true/false, pass/fail), and
    optionally ``annotator`` (default ``file``), ``labelled_at`` (ISO time) and ``job_id`` (the night
    whose answer it grades). A bad line is a ``JobError`` naming the file, line and field."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise JobError(f"{path}: cannot read the labels file: {exc.strerror or exc}") from None
    rows: Iterator[tuple[int, Any]]
    if path.suffix.lower() == ".csv":
        reader = csv.DictReader(io.StringIO(text))
        rows = ((n + 2, row) for n, row in enumerate(reader))  # line 1 is the header
    else:
        rows = ((n + 1, _json_line(path, n + 1, line)) for n, line in enumerate(text.splitlines()) if line.strip())
    out = []
    for line, row in rows:
        out.append(_file_label(path, line, row))
    return out


def _json_line(path: Path, line: int, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise JobError(f"{path} line {line}: not JSON: {exc.msg}") from None


def _file_label(path: Path, line: int, row: Any) -> Label:
    if not isinstance(row, dict):
        raise JobError(f"{path} line {line}: expected an object with {', '.join(FILE_FIELDS[:3])}")
    for name in ("instance_id", "name", "value"):
        if row.get(name) in (None, ""):
            raise JobError(f"{path} line {line}: '{name}' is missing (a label needs instance_id, name and value)")
    value = number(row["value"])
    if value is None:
        raise JobError(f"{path} line {line}: 'value': expected a number, true/false or pass/fail, "
                       f"got {str(row['value'])[:60]!r}")
    annotator = str(row.get("annotator") or "file")
    job = str(row["job_id"]) if row.get("job_id") else None
    labelled = when(row.get("labelled_at"))
    if row.get("labelled_at") and labelled is None:
        raise JobError(f"{path} line {line}: 'labelled_at': expected an ISO time, got {str(row['labelled_at'])[:60]!r}")
    key = json.dumps([job, str(row["instance_id"]), str(row["name"]), annotator])
    import hashlib

    return Label(str(row["instance_id"]), str(row["name"]), value, annotator, "file",
                 hashlib.sha256(key.encode()).hexdigest()[:40], labelled, job)


# -- agreement ------------------------------------------------------------------------------------


@dataclass
class Pairs:
    """(judge, person) pairs of one entry of one night, and each panel member's."""

    pairs: list[tuple[float, float]] = field(default_factory=list)
    members: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    annotators: set[str] = field(default_factory=set)


def judged_value(kind: str, params: dict, result: Any) -> float | None:
    """The judge's score of an item as it is compared with a label: a rating's score (a panel's mean
    to the nearest point), a defect entry's verdict (1 a defect, 0 none)."""
    from evalq.shared.scores.results import is_defect

    if not isinstance(result, dict):
        return None
    if kind == "defect":
        return float(is_defect(result, params.get("threshold")))
    score = result.get("score")
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
        return None
    return float(round(score))


def person_value(kind: str, params: dict, value: float) -> float:
    """A label as it is compared: a defect entry's label as defect or not (a severity past the threshold)."""
    if kind == "defect":
        from evalq.shared.scores.results import human_defect

        return float(human_defect(value if value not in (0.0, 1.0) else bool(value), params.get("threshold")))
    return float(round(value))


def agreement_of(pairs: list[tuple[float, float]]) -> dict:
    """n, exact and within-one agreement, Krippendorff's alpha (ordinal) of (judge, person) pairs."""
    from evalq.shared.judging.panel import ordinal_alpha

    n = len(pairs)
    if not n:
        return {"n": 0, "exact": None, "within_1": None, "alpha": None}
    coincidence: dict[str, float] = {}
    for a, b in pairs:  # two values a unit: each ordered pair once (m - 1 = 1)
        for c, k in ((a, b), (b, a)):
            key = f"{_key(c)}|{_key(k)}"
            coincidence[key] = coincidence.get(key, 0.0) + 1.0
    return {"n": n, "exact": sum(a == b for a, b in pairs) / n,
            "within_1": sum(abs(a - b) <= 1 for a, b in pairs) / n, "alpha": ordinal_alpha(coincidence)}


def _key(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def entry_agreement(found: Pairs) -> dict:
    out = agreement_of(found.pairs)
    out["annotators"] = len(found.annotators)
    if found.members:
        out["members"] = {name: agreement_of(p) for name, p in sorted(found.members.items())}
    return out


# -- the store ------------------------------------------------------------------------------------


def keep(engine: sa.Engine, suite: str, tenant: str | None, found: Iterable[Label]) -> dict[str, int]:
    """Each label once in the store (by its source's id; a changed value or time updated): counts of
    labels ``new``, ``updated`` and ``unchanged``."""
    counts = {"new": 0, "updated": 0, "unchanged": 0}
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    with engine.begin() as conn:
        for label in found:
            row = conn.execute(sa.select(labels.c.id, labels.c.value, labels.c.labelled_at, labels.c.job_id)
                               .where(labels.c.suite == suite, labels.c.source == label.source,
                                      labels.c.source_id == label.source_id)).first()
            values = {"job_id": label.job_id, "instance_id": label.instance_id, "name": label.name,
                      "value": label.value, "annotator": label.annotator, "labelled_at": label.labelled_at}
            if row is None:
                conn.execute(labels.insert().values(suite=suite, tenant=tenant, source=label.source,
                                                    source_id=label.source_id, recorded_at=now, **values))
                counts["new"] += 1
            elif (row.value, row.labelled_at, row.job_id) != (label.value, label.labelled_at, label.job_id):
                conn.execute(labels.update().where(labels.c.id == row.id).values(recorded_at=now, **values))
                counts["updated"] += 1
            else:
                counts["unchanged"] += 1
    return counts


def kept_night(engine: sa.Engine, suite: str, label: Label) -> str | None:
    """The night a label already in the store grades (a file's label read again stays on its night)."""
    with engine.connect() as conn:
        return conn.execute(sa.select(labels.c.job_id).where(labels.c.suite == suite, labels.c.source == label.source,
                                                             labels.c.source_id == label.source_id)).scalar()


def labels_of(engine: sa.Engine, suite: str, job_id: str) -> list[dict]:
    with engine.connect() as conn:
        return [dict(row) for row in conn.execute(
            sa.select(labels).where(labels.c.suite == suite, labels.c.job_id == job_id)).mappings()]


def store_agreement(engine: sa.Engine, job_id: str, name: str, said: dict) -> bool:
    """Keep a night's entry's agreement (replacing an earlier one); True when its alert is this
    caller's to send (the first time it is below the bound: ``said["below"]``)."""
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    with engine.begin() as conn:
        run_id = conn.execute(sa.select(runs.c.id).where(runs.c.job_id == job_id)).scalar()
        if run_id is None:
            return False
        before = conn.execute(sa.select(label_agreement.c.alert).where(
            label_agreement.c.run_id == run_id, label_agreement.c.name == name)).first()
        row = {"n": said["n"], "annotators": said.get("annotators", 0), "exact": said.get("exact"),
               "within_1": said.get("within_1"), "alpha": said.get("alpha"),
               "members": json.dumps(said["members"]) if said.get("members") else None, "computed_at": now}
        alert = before.alert if before is not None else None
        send = bool(said.get("below")) and alert in (None, "none")
        row["alert"] = "sending" if send else (alert or "none")
        if before is None:
            conn.execute(label_agreement.insert().values(run_id=run_id, name=name, **row))
        else:
            conn.execute(label_agreement.update().where(label_agreement.c.run_id == run_id,
                                                        label_agreement.c.name == name).values(**row))
        return send


def set_agreement_alert(engine: sa.Engine, job_id: str, name: str, state: str) -> None:
    with engine.begin() as conn:
        run_id = conn.execute(sa.select(runs.c.id).where(runs.c.job_id == job_id)).scalar()
        conn.execute(label_agreement.update().where(label_agreement.c.run_id == run_id,
                                                    label_agreement.c.name == name).values(alert=state))


def agreements(conn: sa.Connection, run_ids: list[int]) -> dict[int, dict[str, dict]]:
    """Per run, per entry name: the judge's agreement with people's labels, as ``evalq history`` shows it."""
    out: dict[int, dict[str, dict]] = {}
    if not run_ids:
        return out
    for row in conn.execute(sa.select(label_agreement).where(label_agreement.c.run_id.in_(run_ids))).mappings():
        out.setdefault(row["run_id"], {})[row["name"]] = {
            "n": row["n"], "annotators": row["annotators"], "exact": row["exact"], "within_1": row["within_1"],
            "alpha": row["alpha"], **({"members": json.loads(row["members"])} if row["members"] else {})}
    return out


def latest_agreement(engine: sa.Engine, suite: str, tenant: str | None) -> dict | None:
    """The suite's last night people labelled: its job id, when it finished, and its entries' agreement."""
    scope = runs.c.tenant.is_(None) if tenant is None else sa.or_(runs.c.tenant == tenant, runs.c.tenant.is_(None))
    with engine.connect() as conn:
        row = conn.execute(sa.select(runs.c.id, runs.c.job_id, runs.c.finished_at)
                           .join(label_agreement, label_agreement.c.run_id == runs.c.id)
                           .where(runs.c.suite == suite, scope)
                           .order_by(runs.c.finished_at.desc(), runs.c.id.desc()).limit(1)).first()
        if row is None:
            return None
        return {"job_id": row.job_id, "finished_at": row.finished_at.isoformat(timespec="seconds") + "+00:00",
                "entries": agreements(conn, [row.id]).get(row.id, {})}


def agreement_line(name: str, said: dict) -> str:
    """An entry's agreement with people, in words."""
    def num(v: Any) -> str:
        return f"{v:.2f}" if isinstance(v, (int, float)) else "-"

    text = (f"{name}: {said['n']} label(s) by {said.get('annotators', 0)} people; exact {num(said.get('exact'))}, "
            f"within one {num(said.get('within_1'))}, alpha {num(said.get('alpha'))}")
    members = said.get("members") or {}
    if members:
        text += " (members: " + ", ".join(f"{m} alpha {num(a.get('alpha'))}" for m, a in members.items()) + ")"
    return text
