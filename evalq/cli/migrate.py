"""``evalq migrate-judge``: a judge that retires (issue 75) is replaced, and the switch is a marked
break in the suite's history. Before it, the old and the new judge score a calibration sample of the
job's items side by side (a panel of the two, ``evalq.shared.judging.panel``, on each rated entry the
old judge scores): the items people graded first (``human``), then a seeded random share. Per entry,
each judge's mean, their agreement with each other (exact, within one, Cohen's quadratic kappa,
Spearman; the panel's Krippendorff alpha) and, where items carry grades, each one's agreement with
people (``evalq.shared.scores.agreement``). Printed, and written as ``migration.json`` beside the run's
outputs."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import click

from evalq.cli.common import cli
from evalq.shared.core.errors import JobError

SAMPLE = 200


def calibration(instances: list[dict], n: int, seed: int = 0) -> list[dict]:
    """Up to ``n`` instances: those people graded first (in their order), then a seeded random share."""
    graded = [inst for inst in instances if inst.get("human") is not None]
    rest = [inst for inst in instances if inst.get("human") is None]
    picked = graded[:n]
    if len(picked) < n:
        picked += random.Random(seed).sample(rest, min(n - len(picked), len(rest)))
    return picked


def migration_job(raw: dict, job: Any, old: str, new: str, n: int) -> dict:
    """The job the two judges run: the old judge's rated entries, each scored by a panel of the old
    and the new judge, on the calibration sample."""
    from evalq.shared.metrics.registry import REGISTRY

    for name in (old, new):
        if name not in job.judges:
            raise JobError(f"no judge named {name!r} in the job (judges: {', '.join(sorted(job.judges)) or 'none'})")
    if old == new:
        raise JobError("--from and --to name the same judge")
    entries = []
    for m in job.metrics:
        params = m.params.model_dump(mode="json")
        if params.get("judge") == old and not params.get("panel") and REGISTRY.get(m.id).panel:
            params.pop("panel", None)
            entries.append({"id": m.id, **({"name": m.name} if m.name else {}), "parameters": {**params,
                                                                                              "judge": [old, new]}})
    if not entries:
        raise JobError(f"no rated entry of the job is judged by {old!r} alone: nothing to migrate")
    instances = list(job.instances)
    if any("actual-output" not in inst for inst in instances):
        raise JobError("the migration scores the job's answers: its instances must carry actual-output")
    keep = ("judges", "judging", "categories")
    return {**{k: raw[k] for k in keep if k in raw}, "instances": calibration(instances, n), "metrics": entries}


def compare_judges(summary: list[dict], log: list[dict], old: str, new: str) -> list[dict]:
    """Per entry: the two judges' means, their agreement with each other, and with people."""
    from evalq.shared.scores.agreement import Agreement

    rows = []
    for m in summary:
        label = m.get("name") or m["metric"]
        between = Agreement("rating", m.get("parameters"))
        for line in log:
            if (line.get("name") or line.get("metric")) != label or not isinstance(line.get("result"), dict):
                continue
            members = line["result"].get("members") or {}
            a, b = (members.get(j, {}).get("score") for j in (old, new))
            if isinstance(a, int) and isinstance(b, int):  # the old judge's score stands for the grade
                between.add({"result": {"score": b}, "human": a})
        panel = (m.get("score") or {}).get("panel") or {}
        means = {j: (panel.get("members") or {}).get(j, {}).get("mean") for j in (old, new)}
        people = (m.get("agreement") or {}).get("members") or {}
        rows.append({"entry": label, "metric": m["metric"], "n": m.get("n"), "means": means,
                     "agreement": {**(between.result() or {}), "alpha": panel.get("alpha")},
                     "with_people": {j: people[j] for j in (old, new) if people.get(j)}})
    return rows


def render(rows: list[dict], old: str, new: str) -> list[str]:
    def num(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, (int, float)) else "-"

    lines = []
    for row in rows:
        a = row["agreement"]
        lines.append(f"{row['entry']}: {row['n']} items; mean {old} {num(row['means'][old])}, {new} "
                     f"{num(row['means'][new])}; {new} against {old}: exact {num(a.get('exact'))}, within one "
                     f"{num(a.get('within_1'))}, kappa {num(a.get('kappa_quadratic'))}, spearman {num(a.get('spearman'))}, "
                     f"alpha {num(a.get('alpha'))}")
        for judge, got in row["with_people"].items():
            lines.append(f"  {judge} against people ({got['n']} graded): exact {num(got.get('exact'))}, within one "
                         f"{num(got.get('within_1'))}, kappa {num(got.get('kappa_quadratic'))}")
    return lines


@cli.command("migrate-judge")
@click.argument("job_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--from", "old", required=True, help="The judge that retires (a name in the job's judges).")
@click.option("--to", "new", required=True, help="The judge that replaces it (a name in the job's judges).")
@click.option("--sample", type=click.IntRange(min=2), default=SAMPLE, show_default=True,
              help="Items scored by both: those people graded first, then a seeded random share.")
@click.option("--out", default="out/migration", show_default=True, help="Where the run's outputs and migration.json go.")
@click.option("--broker", envvar="EVALQ_BROKER_URL", default=None, metavar="URL",
              help="Run on this cluster [default: an embedded one].")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def migrate_judge(job_file: Path, old: str, new: str, sample: int, out: str, broker: str | None,
                  quiet: bool) -> None:
    """Score a calibration sample of JOB_FILE with the judge that retires and the one replacing it, side
    by side: each judge's mean, their agreement with each other and with people."""
    from evalq.cli.common import read_job
    from evalq.cli.run import run_job
    from evalq.shared.data.storage import Destination, read_lines
    from evalq.shared.job.schema import parse_job

    try:
        raw = json.loads(job_file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise JobError(f"{job_file}: {exc}") from None
    original = read_job(job_file)
    doc = migration_job(raw, original, old, new, sample)
    job = parse_job(doc, source=f"{job_file.stem}-migration")
    dest = Destination(out)
    summary = run_job(job, dest, broker=broker, progress=not quiet)
    log = [json.loads(text) for _, text in read_lines(dest.path("log.jsonl"))]
    rows = compare_judges(summary, log, old, new)
    with dest.open_text("migration.json") as f:
        f.write(json.dumps({"from": old, "to": new, "entries": rows}, indent=2) + "\n")
    for line in render(rows, old, new):
        click.echo(line)
    click.echo(f"wrote {dest.path('migration.json')}", err=True)
    ran = json.loads("\n".join(text for _, text in read_lines(dest.path("run.json"))))
    remember(original, old, new, rows, ran.get("job_id"))


def remember(job: Any, old: str, new: str, rows: list[dict], job_id: str | None) -> None:
    """Keep the measure in the history store: the suite's switch from ``old`` to ``new`` (a marked break)
    then carries it (``evalq.results.judge_breaks``). History off: nothing is kept."""
    from evalq.results.history import HistoryOff, open_store
    from evalq.results.judge_breaks import record_migration

    try:
        store = open_store()
    except HistoryOff:
        return
    kept = record_migration(store.engine, job.suite, job_id, (old, job.judges[old].model), (new, job.judges[new].model),
                            rows)
    click.echo(f"kept in the history store for suite {job.suite}: {kept} entr{'y' if kept == 1 else 'ies'}; "
               f"its switch to {new} will carry this measure", err=True)
