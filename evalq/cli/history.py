"""``evalq history``: the runs of a suite over time, read from the history store
(``evalq.results.history``): as text, as JSON for machines, or as a page."""

from __future__ import annotations

import json
from pathlib import Path

import click

from evalq.cli.common import cli
from evalq.shared.core.display import printable


@cli.command()
@click.argument("suite", required=False)
@click.option("--last", type=click.IntRange(min=1), default=None, help="Only the last N runs.")
@click.option("--json", "as_json", is_flag=True, help="Print the runs as JSON (oldest first).")
@click.option("--html", "html_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write a self-contained page: one chart per metric over the runs, cost per run.")
@click.option("--url", envvar="EVALQ_HISTORY_URL", default=None, metavar="URL",
              help="The history store (env EVALQ_HISTORY_URL) [default: $EVALQ_CACHE_DIR/history.sqlite].")
def history(suite: str | None, last: int | None, as_json: bool, html_file: Path | None, url: str | None) -> None:
    """Runs of SUITE with their values, regressions and cost; without SUITE, every suite and its last run."""
    from evalq.results.history import HistoryOff, open_store
    from evalq.shared.core.errors import JobError

    try:
        store = open_store(url)
    except HistoryOff as exc:
        raise JobError(str(exc)) from None
    if suite is None:
        if html_file is not None:
            raise JobError("--html: name a SUITE (evalq history SUITE --html FILE)")
        suites = store.suites()
        if as_json:
            click.echo(json.dumps({"suites": suites}, indent=2, ensure_ascii=False))
        else:
            _print_suites(suites)
        return
    runs = store.runs_of(suite, last)
    if not runs:
        known = [s["suite"] for s in store.suites()]
        from evalq.shared.core.problems import did_you_mean

        raise JobError(f"suite {suite!r}: no run recorded{did_you_mean(suite, known)}")
    doc = {"suite": suite, "runs": runs}
    if html_file is not None:
        from evalq.results.history_page import render

        html_file.parent.mkdir(parents=True, exist_ok=True)
        html_file.write_text(render(doc), encoding="utf-8")
        click.echo(f"wrote {html_file}", err=True)
    if as_json:
        click.echo(json.dumps(doc, indent=2, ensure_ascii=False))
    elif html_file is None:
        _print_runs(doc)


def _num(value, digits: int = 4) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _print_suites(suites: list[dict]) -> None:
    if not suites:
        click.echo("no run recorded yet")
        return
    click.echo(f"{'suite':<32} {'tenant':<12} {'runs':>5}  {'last run':<25} {'status':<10} {'regr':>4} {'cost':>10}")
    for s in suites:
        last = s["last"]
        click.echo(f"{s['suite']:<32} {printable(s.get('tenant') or '-', 12):<12} {s['runs']:>5}  "
                   f"{last['finished_at']:<25} {last['status']:<10} {last['regressions']:>4} {_num(last['cost'], 2):>10}")


def _print_runs(doc: dict) -> None:
    from evalq.results.report_glance import series_name

    runs = doc["runs"]
    click.echo(f"suite {doc['suite']}: {len(runs)} run(s)")
    click.echo(f"{'finished':<25} {'job':<16} {'status':<10} {'cost':>10} {'tokens':>10} {'regr':>4}  dataset")
    for run in runs:
        click.echo(f"{run['finished_at']:<25} {run['job_id']:<16} {run['status']:<10} {_num(run['cost'], 2):>10} "
                   f"{_num(run['tokens']):>10} {len(run['regressions']):>4}  {(run.get('dataset_digest') or '-')[:12]}")
    series: dict[tuple[str, str], dict[str, float | None]] = {}
    for run in runs:
        for m in run["metrics"]:
            series.setdefault((m["name"], m["field"]), {})[run["job_id"]] = m["value"]
    if series:
        click.echo("")
        click.echo("values, oldest first:")
        for (name, field), values in series.items():
            label = printable(series_name(name, field), 30)
            click.echo(f"  {label:<30} " + " ".join(f"{_num(values.get(run['job_id'])):>8}" for run in runs))
    for run in runs:
        changed = {m["name"]: m["judge_changed"] for m in run["metrics"] if m.get("judge_changed")}
        for name, change in changed.items():
            from evalq.results.history_page import judge_name

            measured = ""
            if change.get("migration"):
                from evalq.results.judge_breaks import migration_words

                measured = f"; {printable(migration_words(change['migration']), 300)}"
            click.echo(f"JUDGE CHANGED {run['finished_at']} job {run['job_id']}: {printable(name)} "
                       f"{printable(judge_name(change['before']))} -> {printable(judge_name(change['after']))}; "
                       f"not compared with the runs before{measured}")
        moved = run.get("dataset_change") or {}
        if moved.get("baseline") and moved.get("compared_on") != "same version":
            from evalq.results.dataset_versions import dataset_line

            click.echo(f"DATASET {run['finished_at']} job {run['job_id']}: "
                       f"{printable(dataset_line({**moved, 'digest': run.get('dataset_digest') or '', 'n': run.get('n_instances')}), 400)}")
        for name, got in (run.get("people") or {}).items():
            from evalq.results.labels import agreement_line

            click.echo(f"PEOPLE {run['finished_at']} job {run['job_id']}: {printable(agreement_line(name, got), 400)}")
        for f in run["regressions"]:
            label = printable(series_name(f["name"], f["field"]))
            click.echo(f"REGRESSION {run['finished_at']} job {run['job_id']}: {label} {f['value']:.4f} vs baseline "
                       f"{f['baseline']:.4f} ({f['delta']:+.4f}, p={f['p_value']:.3g}, "
                       f"{'paired' if f['paired'] else 'unpaired'}, n={f['n']})")
