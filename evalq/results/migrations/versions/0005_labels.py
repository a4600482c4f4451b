"""People in the loop (issue 75): the labels people gave a night's judged items in Phoenix, MLflow or
a file, each once, and the judge's agreement with them per night and entry; what ``evalq
migrate-judge`` measured between two judges, which a later judge change carries.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "labels",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("suite", sa.String(128), nullable=False), sa.Column("tenant", sa.String(64)),
        sa.Column("job_id", sa.String(64), nullable=False), sa.Column("instance_id", sa.String(200), nullable=False),
        sa.Column("name", sa.String(200), nullable=False), sa.Column("value", sa.Float, nullable=False),
        sa.Column("annotator", sa.String(200), nullable=False),
        sa.Column("source", sa.String(16), nullable=False), sa.Column("source_id", sa.String(200), nullable=False),
        sa.Column("labelled_at", sa.DateTime), sa.Column("recorded_at", sa.DateTime, nullable=False),
        sa.UniqueConstraint("suite", "source", "source_id", name="uq_labels_source"))
    op.create_index("ix_labels_job", "labels", ["job_id"])
    op.create_table(
        "label_agreement",
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("n", sa.Integer, nullable=False), sa.Column("annotators", sa.Integer, nullable=False),
        sa.Column("exact", sa.Float), sa.Column("within_1", sa.Float), sa.Column("alpha", sa.Float),
        sa.Column("members", sa.Text), sa.Column("computed_at", sa.DateTime, nullable=False),
        sa.Column("alert", sa.String(16)))
    op.create_table(
        "judge_migrations",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("suite", sa.String(128), nullable=False), sa.Column("name", sa.String(200), nullable=False),
        sa.Column("from_judge", sa.String(200), nullable=False), sa.Column("from_model", sa.String(256), nullable=False),
        sa.Column("to_judge", sa.String(200), nullable=False), sa.Column("to_model", sa.String(256), nullable=False),
        sa.Column("agreement", sa.Text, nullable=False), sa.Column("job_id", sa.String(64)),
        sa.Column("recorded_at", sa.DateTime, nullable=False))
    with op.batch_alter_table("entries") as batch:
        batch.add_column(sa.Column("judge_migration", sa.Text))


def downgrade() -> None:
    with op.batch_alter_table("entries") as batch:
        batch.drop_column("judge_migration")
    op.drop_table("judge_migrations")
    op.drop_table("label_agreement")
    op.drop_index("ix_labels_job", "labels")
    op.drop_table("labels")
