"""byok stamp: a change to a workspace's BYOK keys bumps the principal stamp

Processes cache a workspace's sealed BYOK keys (server/byok/cache.py) under the principal
stamp of migration 0011: a key created, changed or deleted, whoever does it, bumps the
counter, so every process uses or stops using it within the stamp's interval. The data keys
that wrap them (`vault_keys`) bump it when re-wrapped or deleted (a master key rotation);
a new data key is inserted before any key is sealed under it, so its INSERT needs none.

Revision ID: 0012_byok_stamp
Revises: 0011_principal_stamp
Create Date: 2026-11-25
"""

from __future__ import annotations

from alembic import op

revision = "0012_byok_stamp"
down_revision = "0011_principal_stamp"
branch_labels = None
depends_on = None

# (table, trigger suffix, event); the bump itself is migration 0011's.
TRIGGERS = (
    ("byok_keys", "ins", "INSERT"),
    ("byok_keys", "upd", "UPDATE"),
    ("byok_keys", "del", "DELETE"),
    ("vault_keys", "upd", "UPDATE"),
    ("vault_keys", "del", "DELETE"),
)
_BUMP = (
    "INSERT INTO principal_stamp (id, version) VALUES (1, 1) "
    "ON CONFLICT (id) DO UPDATE SET version = principal_stamp.version + 1"
)


def _name(table: str, suffix: str) -> str:
    return f"principal_stamp_{table}_{suffix}"


def upgrade() -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    for table, suffix, event in TRIGGERS:
        if postgresql:
            # Once per statement, not per row: a bulk change bumps it once.
            op.execute(
                f"CREATE TRIGGER {_name(table, suffix)} AFTER {event} ON {table} "
                "FOR EACH STATEMENT EXECUTE FUNCTION principal_stamp_bump()"
            )
        else:
            op.execute(
                f"CREATE TRIGGER {_name(table, suffix)} AFTER {event} ON {table} BEGIN {_BUMP}; END"
            )


def downgrade() -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    for table, suffix, _event in TRIGGERS:
        on = f" ON {table}" if postgresql else ""
        op.execute(f"DROP TRIGGER IF EXISTS {_name(table, suffix)}{on}")
