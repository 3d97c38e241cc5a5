"""sealed webhook secrets: a workspace's signing secret sealed at rest, never in clear

`workspaces.webhook_secret` held each workspace's Standard Webhooks secret in clear. The
secret is now sealed like vault values (server/vault/webhook_secrets.py: AES-256-GCM under a
data key wrapped by the vault's master key) into the two new columns. Sealing needs the
master key, which a migration does not have (it lives in the environment or the data dir):
the values stored in clear are sealed, keeping their value, and the old column cleared by
the first start of the gateway after this migration (`gateway up`, `gateway serve`,
`gateway migrate`), before it serves. The old column stays (always empty from then on), so
that no table is rebuilt: SQLite would drop the principal stamp's triggers with it.

The downgrade drops the sealed columns: an older gateway then makes new secrets, which
receivers must be given again (`gateway workspaces webhook-secret`).

Revision ID: 0014_sealed_webhook_secrets
Revises: 0013_generations_index
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014_sealed_webhook_secrets"
down_revision = "0013_generations_index"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # ADD COLUMN on both databases: no table copy.
    op.add_column("workspaces", sa.Column("webhook_secret_sealed", sa.LargeBinary(), nullable=True))
    op.add_column("workspaces", sa.Column("webhook_secret_nonce", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    # DROP COLUMN (SQLite 3.35+) rather than a batch rebuild: the table's triggers stay.
    op.execute("ALTER TABLE workspaces DROP COLUMN webhook_secret_nonce")
    op.execute("ALTER TABLE workspaces DROP COLUMN webhook_secret_sealed")
