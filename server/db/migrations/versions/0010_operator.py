"""the operator credential

One row: the SHA-256 of the operator key `gateway up` / `gateway migrate` issue when there is
none (the plaintext goes to a file of mode 0600 in the data dir, never to the database or a
log). It signs in to the console and calls the operator routes (/api/v1/workspaces...).

Revision ID: 0010_operator
Revises: 0009_guardrail_budgets
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010_operator"
down_revision = "0009_guardrail_budgets"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "operator_keys",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )


def downgrade() -> None:
    op.drop_table("operator_keys")
