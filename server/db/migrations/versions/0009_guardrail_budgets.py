"""guardrail budgets and key assignments

A guardrail may carry a spending budget (limit_micros over reset_interval: daily, weekly,
monthly), and may be assigned to keys: an assigned guardrail applies to those keys only, one
without assignments to every key of its workspace.

Revision ID: 0009_guardrail_budgets
Revises: 0008_byok
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_guardrail_budgets"
down_revision = "0008_byok"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("guardrails") as batch:
        batch.add_column(sa.Column("limit_micros", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("reset_interval", sa.String(length=16), nullable=True))
    op.create_table(
        "guardrail_key_assignments",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("guardrail_id", sa.String(length=40), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["guardrail_id"], ["guardrails.id"]),
        sa.ForeignKeyConstraint(["key_hash"], ["api_keys.hash"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("guardrail_id", "key_hash", name="uq_guardrail_key_assignment"),
    )
    op.create_index(
        "ix_guardrail_key_assignments_key_hash", "guardrail_key_assignments", ["key_hash"]
    )


def downgrade() -> None:
    op.drop_index("ix_guardrail_key_assignments_key_hash", table_name="guardrail_key_assignments")
    op.drop_table("guardrail_key_assignments")
    with op.batch_alter_table("guardrails") as batch:
        batch.drop_column("reset_interval")
        batch.drop_column("limit_micros")
