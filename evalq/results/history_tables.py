"""The history store's tables (SQLAlchemy Core; ``evalq.results.history`` says what each holds; the
Alembic migrations in ``migrations/`` make them)."""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()
runs = sa.Table(
    "runs", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.String(64), nullable=False, unique=True),
    sa.Column("suite", sa.String(128), nullable=False),
    sa.Column("request_id", sa.String(200)), sa.Column("tenant", sa.String(64)),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("started_at", sa.DateTime), sa.Column("finished_at", sa.DateTime, nullable=False),
    sa.Column("source", sa.Text), sa.Column("dataset", sa.Text), sa.Column("model", sa.String(256)),
    sa.Column("out", sa.Text), sa.Column("n_instances", sa.Integer),
    sa.Column("calls", sa.BigInteger), sa.Column("tokens", sa.BigInteger), sa.Column("cost", sa.Float),
    sa.Column("error", sa.Text),
    sa.Column("alert", sa.String(16)),  # none | pending | sending | sent | failed
    # its dataset's version (evalq.shared.data.versions) and how it differs from its baseline's (JSON)
    sa.Column("dataset_digest", sa.String(64)), sa.Column("dataset_change", sa.Text),
    sa.Index("ix_runs_suite_digest", "suite", "dataset_digest"),
)


def _run_key() -> tuple[sa.Column, sa.Column]:
    """A row of a run's entry: (run, slot), dropped with its run."""
    return (sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
            sa.Column("slot", sa.Integer, primary_key=True))


entries = sa.Table(
    "entries", metadata, *_run_key(),
    sa.Column("metric", sa.String(128), nullable=False), sa.Column("name", sa.String(200), nullable=False),
    sa.Column("parameters", sa.Text, nullable=False),
    sa.Column("n", sa.Integer), sa.Column("n_errors", sa.Integer), sa.Column("n_skipped", sa.Integer),
    sa.Column("calls", sa.BigInteger), sa.Column("tokens", sa.BigInteger), sa.Column("cost", sa.Float),
    # who judged the entry (a judge's: JSON of evalq.shared.judging.judges.judge_identity), its id, and the
    # identity it changed from since the suite's last run
    sa.Column("judge", sa.Text), sa.Column("judge_id", sa.String(32)), sa.Column("judge_before", sa.Text),
    # what `evalq migrate-judge` measured between the two judges of a change (evalq.results.judge_breaks)
    sa.Column("judge_migration", sa.Text),
)
entry_values = sa.Table(
    "entry_values", metadata, *_run_key(),
    sa.Column("field", sa.String(128), primary_key=True),
    sa.Column("value", sa.Float), sa.Column("ci_low", sa.Float), sa.Column("ci_high", sa.Float),
    sa.Column("n", sa.Integer), sa.Column("sd", sa.Float), sa.Column("worse", sa.String(8), nullable=False),
)
item_values = sa.Table(
    "item_values", metadata, *_run_key(),
    sa.Column("field", sa.String(128), primary_key=True), sa.Column("data", sa.LargeBinary, nullable=False),
)
regressions = sa.Table(
    "regressions", metadata, *_run_key(),
    sa.Column("field", sa.String(128), primary_key=True),
    sa.Column("metric", sa.String(128), nullable=False), sa.Column("name", sa.String(200), nullable=False),
    sa.Column("value", sa.Float), sa.Column("baseline", sa.Float), sa.Column("delta", sa.Float),
    sa.Column("p_value", sa.Float), sa.Column("paired", sa.Boolean), sa.Column("n", sa.Integer),
    sa.Column("baseline_runs", sa.Integer),
)
run_versions = sa.Table(  # a run's version table: (id hash, content hash) of the instances in its sample
    "run_versions", metadata,
    sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("rate", sa.Float, nullable=False), sa.Column("data", sa.LargeBinary, nullable=False),
)
labels = sa.Table(  # people's labels of a night's judged items (evalq.results.labels), each once
    "labels", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("suite", sa.String(128), nullable=False), sa.Column("tenant", sa.String(64)),
    sa.Column("job_id", sa.String(64), nullable=False), sa.Column("instance_id", sa.String(200), nullable=False),
    sa.Column("name", sa.String(200), nullable=False), sa.Column("value", sa.Float, nullable=False),
    sa.Column("annotator", sa.String(200), nullable=False),
    sa.Column("source", sa.String(16), nullable=False), sa.Column("source_id", sa.String(200), nullable=False),
    sa.Column("labelled_at", sa.DateTime), sa.Column("recorded_at", sa.DateTime, nullable=False),
    sa.UniqueConstraint("suite", "source", "source_id", name="uq_labels_source"),
    sa.Index("ix_labels_job", "job_id"),
)
label_agreement = sa.Table(  # a night's judge against its labels, per entry (evalq.results.labels)
    "label_agreement", metadata,
    sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("name", sa.String(200), primary_key=True),
    sa.Column("n", sa.Integer, nullable=False), sa.Column("annotators", sa.Integer, nullable=False),
    sa.Column("exact", sa.Float), sa.Column("within_1", sa.Float), sa.Column("alpha", sa.Float),
    sa.Column("members", sa.Text), sa.Column("computed_at", sa.DateTime, nullable=False),
    sa.Column("alert", sa.String(16)),  # none | sending | sent | failed: a drop below the bound, told once
)
judge_migrations = sa.Table(  # what `evalq migrate-judge` measured, per suite and entry
    "judge_migrations", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("suite", sa.String(128), nullable=False), sa.Column("name", sa.String(200), nullable=False),
    sa.Column("from_judge", sa.String(200), nullable=False), sa.Column("from_model", sa.String(256), nullable=False),
    sa.Column("to_judge", sa.String(200), nullable=False), sa.Column("to_model", sa.String(256), nullable=False),
    sa.Column("agreement", sa.Text, nullable=False), sa.Column("job_id", sa.String(64)),
    sa.Column("recorded_at", sa.DateTime, nullable=False),
)
REGRESSION_FIELDS = ("metric", "name", "field", "value", "baseline", "delta", "p_value", "paired", "n",
                     "baseline_runs")
