"""ledger indexes: the one index a reader uses, none that only costs a charge a page

Every charge inserts a ledger row, and each index of the table is one more page the charge's
transaction writes (on SQLite one more WAL frame in its COMMIT). The ledger had two
single-column indexes: on `key_hash`, which no query reads (a key's spend is read from its
counters), and on `account_id`, which the purchases list (GET /api/v1/credits/purchases)
used only to find the account's rows, charges included, and then filtered by kind and
sorted them. One index on (account_id, kind, created_at) replaces both: the purchases list
seeks an account's purchases in the order it pages them, and a charge writes one index page
fewer.

Revision ID: 0018_ledger_indexes
Revises: 0017_claim_indexes
Create Date: 2026-11-28
"""

from __future__ import annotations

from alembic import op

revision = "0018_ledger_indexes"
down_revision = "0017_claim_indexes"
branch_labels = None
depends_on = None

TABLE = "ledger_entries"
PURCHASES = "ix_ledger_entries_account_kind_created"


def upgrade() -> None:
    op.create_index(PURCHASES, TABLE, ["account_id", "kind", "created_at"])
    op.drop_index("ix_ledger_entries_key_hash", table_name=TABLE)
    op.drop_index("ix_ledger_entries_account_id", table_name=TABLE)


def downgrade() -> None:
    op.create_index("ix_ledger_entries_account_id", TABLE, ["account_id"])
    op.create_index("ix_ledger_entries_key_hash", TABLE, ["key_hash"])
    op.drop_index(PURCHASES, table_name=TABLE)
