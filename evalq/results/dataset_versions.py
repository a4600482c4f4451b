"""Which earlier runs a night is compared with, by the version of its dataset (issue 75), and what
it says of how the data moved.

A night's baseline is, by default, the suite's last runs that ended done **on the same dataset
version** (``evalq.shared.data.versions``: the digest of its instances' test cases). Where no earlier
run has that version, the suite's last runs on any data are the baseline, compared **on the items
they share unchanged** only (paired, by instance id and content; a mean over other data is never
compared unpaired), and the difference is said: ids added, removed and changed. A suite pins a
version with ``regression.dataset``: its baseline is then the runs on that version, over the items
shared unchanged with it. Runs an older store kept without a digest are compared as before.

What is said (run.json's ``regressions.dataset``, report.html's header, ``evalq run``'s stderr and
the history store's ``runs.dataset_change``)::

    {"digest": "...", "n": 125, "compared_on": "shared items", "shared": 112,
     "baseline": {"job_id": "...", "digest": "...", "n": 115},
     "added": 10, "removed": 0, "changed": 3, "about": false,
     "examples": {"added": ["q115", ...], "removed": [], "changed": ["q7", ...]}}
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Callable, Iterable

import redis
import sqlalchemy as sa

from evalq.results.history_tables import run_versions, runs
from evalq.shared.data.versions import Change, Version, change, id_hash

log = logging.getLogger("evalq.history")

EXAMPLES = 5  # ids named of each kind of change


def version_of(r: redis.Redis, job_id: str, spec) -> Version | None:
    """The job's dataset version with its table, as its submission kept it; None for a job without
    one, or whose table is gone (a Redis that lost it: the digest alone is then recorded)."""
    head = spec.dataset_version
    if not head:
        return None
    try:
        table = _table(r, job_id, spec, head)
    except Exception as exc:  # noqa: BLE001  (a store or Redis that cannot say: the digest alone)
        log.warning("job %s: its dataset version's table could not be read: %s", job_id, exc)
        table = None
    return Version(head["digest"], int(head.get("n") or 0), float(head.get("rate") or 1.0), table or b"")


def _table(r: redis.Redis, job_id: str, spec, head: dict) -> bytes | None:
    from evalq.shared.cluster import keys
    from evalq.shared.data.versions import TABLE_FILE

    if head.get("table") == "store":
        return spec.place.get(TABLE_FILE, missing_ok=True) if spec.place is not None else None
    return r.get(keys.dataset_version(job_id))


@dataclass
class Against:
    """A night's baseline runs (newest first), which of their items are compared (per run: a test on
    the instance id, None for all), which may be compared unpaired, and what is said."""

    runs: list[int] = field(default_factory=list)
    keep: dict[int, Callable[[str], bool]] = field(default_factory=dict)
    unpaired: set[int] = field(default_factory=set)
    said: dict | None = None
    change: Change | None = None


def against(conn: sa.Connection, scope: sa.Select, how_many: int, version: Version | None,
            pin: str | None) -> Against:
    """The baseline of a night of ``version`` among ``scope`` (the suite's earlier runs that ended done,
    newest first: id, job_id, dataset_digest, n_instances)."""
    if version is None:
        ids = conn.execute(scope.limit(how_many)).scalars().all()
        return Against(list(ids), unpaired=set(ids))
    said: dict = {"digest": version.digest, "n": version.n}
    if pin:
        said["pinned"] = pin
        rows, how = conn.execute(scope.where(runs.c.dataset_digest.like(f"{pin}%")).limit(how_many)).all(), "pinned version"
    else:
        rows, how = conn.execute(scope.where(runs.c.dataset_digest == version.digest).limit(how_many)).all(), "same version"
        if not rows:
            rows, how = conn.execute(scope.limit(how_many)).all(), "shared items"
    if not rows:
        return Against(said=said)
    said["compared_on"] = how
    out = Against([row.id for row in rows], said=said)
    differ = [row.id for row in rows if row.dataset_digest not in (None, version.digest)]
    tables = {t.run_id: (t.rate, t.data) for t in conn.execute(
        sa.select(run_versions.c.run_id, run_versions.c.rate, run_versions.c.data)
        .where(run_versions.c.run_id.in_(differ)))} if differ else {}
    changes: dict[str, Change] = {}
    for row in rows:
        if row.dataset_digest is None:  # an older store's run: compared as before
            out.unpaired.add(row.id)
            continue
        if row.dataset_digest == version.digest:
            out.unpaired.add(row.id)
            continue
        kept = tables.get(row.id)
        if kept is None or not version.table:  # nothing says which items are the same: none is compared
            out.keep[row.id] = _none
            continue
        moved = changes.get(row.dataset_digest)
        if moved is None:
            moved = changes[row.dataset_digest] = change(version.table, version.rate, kept[1], kept[0])
        unchanged = moved.unchanged
        out.keep[row.id] = lambda iid, unchanged=unchanged: id_hash(iid) in unchanged
    latest = rows[0]
    said["baseline"] = {"job_id": latest.job_id, "digest": latest.dataset_digest, "n": latest.n_instances}
    if latest.dataset_digest == version.digest:
        said.update(added=0, removed=0, changed=0, about=False, shared=version.n)
    elif latest.dataset_digest is not None and latest.dataset_digest in changes:
        out.change = changes[latest.dataset_digest]
        said.update(out.change.counts(), shared=round(len(out.change.unchanged) / out.change.rate))
    return out


def _none(_iid: str) -> bool:
    return False


def name_examples(found: Against, names: Iterable[Iterable[str]]) -> None:
    """Put up to ``EXAMPLES`` ids of each kind of change in what is said, found among ``names`` (the
    night's and the baseline's item ids)."""
    moved = found.change
    if moved is None or found.said is None:
        return
    wanted = {kind: set(getattr(moved, kind)[:1000]) for kind in ("added", "removed", "changed")}
    examples: dict[str, list[str]] = {kind: [] for kind in wanted}
    if any(wanted.values()):
        seen: set[int] = set()
        for ids in names:
            if id(ids) in seen:  # a run's fields share one list of ids
                continue
            seen.add(id(ids))
            for iid in ids:
                h = id_hash(iid)
                for kind, hashes in wanted.items():
                    if h in hashes and len(examples[kind]) < EXAMPLES and iid not in examples[kind]:
                        examples[kind].append(iid)
            if all(len(examples[k]) >= min(EXAMPLES, len(wanted[k])) for k in wanted):
                break
    found.said["examples"] = examples


def dataset_line(said: dict) -> str:
    """How the night's data compares with its baseline's, in a line (report.html, ``evalq run``)."""
    digest = said.get("digest", "")[:12]
    head = f"{said.get('n')} instances, version {digest}"
    base = said.get("baseline")
    if not base:
        return head + (f"; no earlier run of the suite on the pinned version {said['pinned']}"
                       if said.get("pinned") else "")
    if said.get("compared_on") == "same version" or base.get("digest") == said.get("digest"):
        return head + " (the baseline's)"
    if base.get("digest") is None:
        return head + "; the baseline's version is not known (recorded by an older evalq): compared as before"
    about = "about " if said.get("about") else ""
    moved = f"{about}{said.get('added', 0)} added, {said.get('removed', 0)} removed, {said.get('changed', 0)} changed"
    named = "; ".join(f"{kind}: {', '.join(ids)}" for kind, ids in (said.get("examples") or {}).items() if ids)
    pinned = f"the pinned version {said['pinned']}" if said.get("pinned") else "the baseline's"
    return (f"{head}; against {pinned} ({base.get('n')} instances, version {str(base.get('digest'))[:12]}): "
            f"{moved}; regressions judged on the {said.get('shared', 0)} items shared unchanged"
            + (f" ({named})" if named else ""))


def stored_change(said: dict | None) -> str | None:
    """What the history store keeps of it (``runs.dataset_change``)."""
    if not said:
        return None
    return json.dumps({k: v for k, v in said.items() if k not in ("digest", "n")}, sort_keys=True)
