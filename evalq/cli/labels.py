"""``evalq labels``: people's labels of a suite's nights, from Phoenix, MLflow or a file, into the history
store, and the judge's agreement with them per night (``evalq.results.labels``)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from evalq.cli.common import cli


@cli.command()
@click.argument("suite")
@click.option("--from", "sources", multiple=True, metavar="SINK",
              help="Read HUMAN labels from the operator's Phoenix or MLflow sink of this name (EVALQ_SINKS); "
                   "repeatable.")
@click.option("--file", "files", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Read labels from a JSON Lines or CSV file (instance_id, name, value[, annotator, labelled_at, "
                   "job_id]); repeatable.")
@click.option("--last", type=click.IntRange(min=1), default=7, show_default=True,
              help="The suite's last N runs whose judged items the labels are matched to.")
@click.option("--min-alpha", type=click.FloatRange(-1, 1), envvar="EVALQ_LABELS_MIN_ALPHA", default=0.667,
              show_default=True, help="An entry's alpha against people below this is alerted (env EVALQ_LABELS_MIN_ALPHA).")
@click.option("--json", "as_json", is_flag=True, help="Print what was read and the agreement as JSON.")
@click.option("--url", envvar="EVALQ_HISTORY_URL", default=None, metavar="URL",
              help="The history store (env EVALQ_HISTORY_URL) [default: $EVALQ_CACHE_DIR/history.sqlite].")
def labels(suite: str, sources: tuple[str, ...], files: tuple[Path, ...], last: int, min_alpha: float,
           as_json: bool, url: str | None) -> None:
    """Read people's labels of SUITE's judged items and measure its judges against them, per night."""
    from evalq.results.history import HistoryOff, open_store
    from evalq.results.label_pull import pull
    from evalq.results.label_sources import sink
    from evalq.results.labels import read_file
    from evalq.shared.core.errors import JobError

    if not sources and not files:
        raise JobError("evalq labels: name where the labels are: --from SINK (Phoenix or MLflow) or --file FILE")
    readers = {name: sink(name) for name in sources}  # each checked before anything is read
    from_files = [label for path in files for label in read_file(path)]
    try:
        store = open_store(url)
    except HistoryOff as exc:
        raise JobError(str(exc)) from None
    runs = [run for run in store.runs_of(suite, last) if run["status"] == "done"]
    if not runs:
        raise JobError(f"suite {suite!r}: no run that ended done is recorded")
    pulled = pull(store, suite, runs, readers, from_files, min_alpha)
    counts, unmatched = pulled.counts, pulled.unmatched
    if as_json:
        click.echo(json.dumps({"suite": suite, "labels": {**counts, "unmatched": unmatched}, "nights": pulled.nights},
                              indent=2, ensure_ascii=False))
        return
    click.echo(f"suite {suite}: {counts['new']} new label(s), {counts['updated']} updated, {counts['unchanged']} "
               f"unchanged" + (f", {unmatched} not matched to a judged item of the last {last} runs" if unmatched else ""))
    from evalq.results.labels import agreement_line

    for night in pulled.nights:
        for name, got in night["entries"].items():
            flag = "  BELOW " + f"{min_alpha:g}" if got.get("below") else ""
            click.echo(f"night {night['job_id']} ({night['finished_at']}): {agreement_line(name, got)}{flag}")
