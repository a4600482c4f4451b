"""Each entry's judge identity (issue 61): who judged it (model, the versions the provider said
answered, deployments, a digest of the prompt), a short id of what decides a verdict, and, where the
judge changed since the suite's last run, the identity it changed from.

A store made by 0002 keeps its runs: their entries have no judge id and are compared with any judge.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("entries") as batch:
        batch.add_column(sa.Column("judge", sa.Text))
        batch.add_column(sa.Column("judge_id", sa.String(32)))
        batch.add_column(sa.Column("judge_before", sa.Text))


def downgrade() -> None:
    with op.batch_alter_table("entries") as batch:
        batch.drop_column("judge_before")
        batch.drop_column("judge_id")
        batch.drop_column("judge")
