"""The first history store: runs, their entries' values, and regressions.

Revision ID: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(64), nullable=False, unique=True),
        sa.Column("suite", sa.String(128), nullable=False, index=True),
        sa.Column("request_id", sa.String(200)),
        sa.Column("tenant", sa.String(64)),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("started_at", sa.DateTime),
        sa.Column("finished_at", sa.DateTime, nullable=False),
        sa.Column("source", sa.Text),
        sa.Column("dataset", sa.Text),
        sa.Column("model", sa.String(256)),
        sa.Column("out", sa.Text),
        sa.Column("n_instances", sa.Integer),
        sa.Column("calls", sa.BigInteger),
        sa.Column("tokens", sa.BigInteger),
        sa.Column("cost", sa.Float),
        sa.Column("error", sa.Text),
    )
    op.create_table(
        "entries",
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("slot", sa.Integer, primary_key=True),
        sa.Column("metric", sa.String(128), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("parameters", sa.Text, nullable=False),
        sa.Column("n", sa.Integer),
        sa.Column("n_errors", sa.Integer),
        sa.Column("n_skipped", sa.Integer),
        sa.Column("calls", sa.BigInteger),
        sa.Column("tokens", sa.BigInteger),
        sa.Column("cost", sa.Float),
    )
    op.create_table(
        "entry_values",
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("slot", sa.Integer, primary_key=True),
        sa.Column("field", sa.String(128), primary_key=True),
        sa.Column("value", sa.Float),
        sa.Column("ci_low", sa.Float),
        sa.Column("ci_high", sa.Float),
        sa.Column("n", sa.Integer),
        sa.Column("sd", sa.Float),
        sa.Column("worse", sa.String(8), nullable=False),
    )
    op.create_table(
        "regressions",
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("slot", sa.Integer, primary_key=True),
        sa.Column("field", sa.String(128), primary_key=True),
        sa.Column("metric", sa.String(128), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("value", sa.Float),
        sa.Column("baseline", sa.Float),
        sa.Column("delta", sa.Float),
        sa.Column("p_value", sa.Float),
        sa.Column("paired", sa.Boolean),
        sa.Column("n", sa.Integer),
        sa.Column("baseline_runs", sa.Integer),
    )


def downgrade() -> None:
    for table in ("regressions", "entry_values", "entries", "runs"):
        op.drop_table(table)
