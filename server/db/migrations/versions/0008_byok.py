"""byok: a workspace's own provider keys (sealed) and its monthly BYOK request counts

Revision ID: 0008_byok
Revises: 0007
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_byok"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "byok_keys",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("workspace_id", sa.String(length=40), nullable=False),
        sa.Column("provider", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=True),
        sa.Column("label", sa.String(length=32), nullable=False),
        sa.Column("ciphertext", sa.LargeBinary(), nullable=False),
        sa.Column("nonce", sa.LargeBinary(), nullable=False),
        sa.Column("sort_order", sa.Integer(), nullable=False),
        sa.Column("is_fallback", sa.Boolean(), nullable=False),
        sa.Column("is_required", sa.Boolean(), nullable=False),
        sa.Column("is_byok_only", sa.Boolean(), nullable=False),
        sa.Column("disabled", sa.Boolean(), nullable=False),
        sa.Column("allowed_models", sa.JSON(), nullable=True),
        sa.Column("allowed_api_key_hashes", sa.JSON(), nullable=True),
        sa.Column("allowed_user_ids", sa.JSON(), nullable=True),
        sa.Column("declared_region", sa.String(length=16), nullable=True),
        sa.Column("declared_zdr", sa.Boolean(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["workspace_id"], ["workspaces.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_byok_keys_workspace_provider", "byok_keys", ["workspace_id", "provider"])
    op.create_table(
        "byok_monthly_requests",
        sa.Column("account_id", sa.String(length=40), nullable=False),
        sa.Column("month_start", sa.Date(), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("account_id", "month_start"),
    )
    with op.batch_alter_table("video_jobs") as batch:
        batch.add_column(sa.Column("byok_hold_id", sa.String(length=40), nullable=True))
        batch.add_column(sa.Column("byok_key_id", sa.String(length=40), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("video_jobs") as batch:
        batch.drop_column("byok_key_id")
        batch.drop_column("byok_hold_id")
    op.drop_table("byok_monthly_requests")
    op.drop_index("ix_byok_keys_workspace_provider", table_name="byok_keys")
    op.drop_table("byok_keys")
