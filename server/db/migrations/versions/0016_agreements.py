"""agreements: what every process on one database must agree on, checked before serving

Two gateways on one database, each with its own data dir, each generated a vault master key
of its own: the second one's vault writes failed with 500 (issue 30). The table holds, by
name, a value the first process writes and every later one compares with its own before
serving: "vault-master-key" is a check value of the vault master key (an HMAC of a constant
under a key derived from it, never the key; server/vault/keycheck.py). No row is written
here: a migration has no master key (it lives in the environment or the data dir).

Revision ID: 0016_agreements
Revises: 0015_workspace_disabled
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016_agreements"
down_revision = "0015_workspace_disabled"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "agreements",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.String(length=128), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )


def downgrade() -> None:
    op.drop_table("agreements")
