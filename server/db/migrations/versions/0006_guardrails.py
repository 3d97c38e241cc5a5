"""guardrails

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "guardrails",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("workspace_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("description", sa.String(length=1000), nullable=True),
        sa.Column("allowed_models", sa.JSON(), nullable=True),
        sa.Column("ignored_models", sa.JSON(), nullable=True),
        sa.Column("allowed_providers", sa.JSON(), nullable=True),
        sa.Column("ignored_providers", sa.JSON(), nullable=True),
        sa.Column("max_cost_per_request_micros", sa.BigInteger(), nullable=True),
        sa.Column("max_video_duration_seconds", sa.Integer(), nullable=True),
        sa.Column("include_byok_in_budgets", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["workspace_id"], ["workspaces.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_guardrails_workspace_id", "guardrails", ["workspace_id"])


def downgrade() -> None:
    op.drop_index("ix_guardrails_workspace_id", table_name="guardrails")
    op.drop_table("guardrails")
