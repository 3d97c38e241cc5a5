"""workspace disabled: the operator can turn a workspace off

`workspaces.disabled`: while true every key of the workspace is refused (401, as a disabled
key is); nothing of the workspace is deleted, and its video jobs already accepted still
finish, are charged and send their webhooks. Turning it off again restores the keys as they
were. The principal stamp's triggers (0011) already fire on any change to `workspaces`, so
every process drops what it cached about the workspace's keys within its interval.

Revision ID: 0015_workspace_disabled
Revises: 0014_sealed_webhook_secrets
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015_workspace_disabled"
down_revision = "0014_sealed_webhook_secrets"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # ADD COLUMN on both databases: no table copy (SQLite would drop the stamp's triggers).
    op.add_column(
        "workspaces",
        sa.Column("disabled", sa.Boolean(), nullable=False, server_default=sa.false()),
    )


def downgrade() -> None:
    # DROP COLUMN (SQLite 3.35+) rather than a batch rebuild: the table's triggers stay.
    op.execute("ALTER TABLE workspaces DROP COLUMN disabled")
