"""foundation: accounts, workspaces, interns, keys, usage counters, ledger

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "accounts",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("credits_purchased_micros", sa.BigInteger(), nullable=False),
        sa.Column("exempt_free_limits", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "usage_counters",
        sa.Column("subject", sa.String(length=8), nullable=False),
        sa.Column("subject_id", sa.String(length=64), nullable=False),
        sa.Column("period", sa.String(length=8), nullable=False),
        sa.Column("period_start", sa.Date(), nullable=False),
        sa.Column("spend_micros", sa.BigInteger(), nullable=False),
        sa.Column("byok_micros", sa.BigInteger(), nullable=False),
        sa.Column("free_requests", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("subject", "subject_id", "period", "period_start"),
    )
    op.create_table(
        "ledger_entries",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("account_id", sa.String(length=40), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=True),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("amount_micros", sa.BigInteger(), nullable=False),
        sa.Column("is_byok", sa.Boolean(), nullable=False),
        sa.Column("reference", sa.String(length=255), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"],
            ["accounts.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("ledger_entries", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_ledger_entries_account_id"), ["account_id"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_ledger_entries_key_hash"), ["key_hash"], unique=False)

    op.create_table(
        "workspaces",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("account_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("intern_programme", sa.Boolean(), nullable=False),
        sa.Column("vault_writes_disabled", sa.Boolean(), nullable=False),
        sa.Column("default_callback_url", sa.String(length=2048), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"],
            ["accounts.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    with op.batch_alter_table("workspaces", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_workspaces_account_id"), ["account_id"], unique=False)

    op.create_table(
        "interns",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("workspace_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("workspace_id", "name"),
    )
    with op.batch_alter_table("interns", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_interns_workspace_id"), ["workspace_id"], unique=False)

    op.create_table(
        "api_keys",
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.Column("workspace_id", sa.String(length=40), nullable=False),
        sa.Column("intern_id", sa.String(length=40), nullable=True),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("label", sa.String(length=64), nullable=False),
        sa.Column("limit_micros", sa.BigInteger(), nullable=True),
        sa.Column("limit_reset", sa.String(length=16), nullable=True),
        sa.Column("include_byok_in_limit", sa.Boolean(), nullable=False),
        sa.Column("disabled", sa.Boolean(), nullable=False),
        sa.Column("is_management", sa.Boolean(), nullable=False),
        sa.Column("exempt_free_limits", sa.Boolean(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("creator_user_id", sa.String(length=255), nullable=True),
        sa.Column("external_user", sa.String(length=255), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["intern_id"],
            ["interns.id"],
        ),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
        ),
        sa.PrimaryKeyConstraint("hash"),
    )
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_api_keys_workspace_id"), ["workspace_id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_api_keys_workspace_id"))

    op.drop_table("api_keys")
    with op.batch_alter_table("interns", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_interns_workspace_id"))

    op.drop_table("interns")
    with op.batch_alter_table("workspaces", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_workspaces_account_id"))

    op.drop_table("workspaces")
    with op.batch_alter_table("ledger_entries", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_ledger_entries_key_hash"))
        batch_op.drop_index(batch_op.f("ix_ledger_entries_account_id"))

    op.drop_table("ledger_entries")
    op.drop_table("usage_counters")
    op.drop_table("accounts")
