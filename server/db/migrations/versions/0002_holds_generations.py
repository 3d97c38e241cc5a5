"""credit holds and generation records

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "generations",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("account_id", sa.String(length=40), nullable=False),
        sa.Column("workspace_id", sa.String(length=40), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("model", sa.String(length=255), nullable=False),
        sa.Column("provider", sa.String(length=64), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("cost_micros", sa.BigInteger(), nullable=False),
        sa.Column("is_byok", sa.Boolean(), nullable=False),
        sa.Column("seconds", sa.Numeric(precision=18, scale=6), nullable=True),
        sa.Column("latency_ms", sa.Integer(), nullable=True),
        sa.Column("session_id", sa.String(length=256), nullable=True),
        sa.Column("user", sa.String(length=256), nullable=True),
        sa.Column("trace", sa.JSON(), nullable=True),
        sa.Column("error", sa.String(length=1000), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("generations", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_generations_account_id"), ["account_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_generations_created_at"), ["created_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_generations_key_hash"), ["key_hash"], unique=False)

    op.create_table(
        "credit_holds",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("account_id", sa.String(length=40), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("amount_micros", sa.BigInteger(), nullable=False),
        sa.Column("counts_against_balance", sa.Boolean(), nullable=False),
        sa.Column("counts_against_key_limit", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"],
            ["accounts.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("credit_holds", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_credit_holds_account_id"), ["account_id"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_credit_holds_key_hash"), ["key_hash"], unique=False)

    with op.batch_alter_table("accounts", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("lock_version", sa.BigInteger(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("accounts", schema=None) as batch_op:
        batch_op.drop_column("lock_version")

    with op.batch_alter_table("credit_holds", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_credit_holds_key_hash"))
        batch_op.drop_index(batch_op.f("ix_credit_holds_account_id"))

    op.drop_table("credit_holds")
    with op.batch_alter_table("generations", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_generations_key_hash"))
        batch_op.drop_index(batch_op.f("ix_generations_created_at"))
        batch_op.drop_index(batch_op.f("ix_generations_account_id"))

    op.drop_table("generations")
