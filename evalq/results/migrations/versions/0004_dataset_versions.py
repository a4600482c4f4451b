"""Dataset versions (issue 75): each run's dataset digest, how its instances differ from its
baseline's (added, removed, changed), and the table of its instances' hashes that says so.

A store made by 0003 keeps its runs: they have no digest, and are compared as before (any data).

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("dataset_digest", sa.String(64)))
        batch.add_column(sa.Column("dataset_change", sa.Text))
    op.create_table(
        "run_versions",
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("rate", sa.Float, nullable=False), sa.Column("data", sa.LargeBinary, nullable=False))
    op.create_index("ix_runs_suite_digest", "runs", ["suite", "dataset_digest"])


def downgrade() -> None:
    op.drop_index("ix_runs_suite_digest", "runs")
    op.drop_table("run_versions")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("dataset_change")
        batch.drop_column("dataset_digest")
