"""Per-instance values (regressions paired by instance id) and the alert's state per run.

A store made by 0001 keeps its runs: they have no instance values, so a later run is
compared with them unpaired, from their means and standard deviations.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "item_values",
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("slot", sa.Integer, primary_key=True),
        sa.Column("field", sa.String(128), primary_key=True),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("alert", sa.String(16)))
        batch.create_index("ix_runs_suite_finished", ["suite", "finished_at"])


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_index("ix_runs_suite_finished")
        batch.drop_column("alert")
    op.drop_table("item_values")
