"""principal stamp: one counter every change to who a caller is bumps

Processes cache a caller's key, workspace, account and guardrails (server/db/stamp.py) and
compare this counter at most once a second; triggers bump it on every change that could
alter an authentication or a policy decision, whoever makes it (a server process, the CLI,
SQL typed by an operator). Not on `api_keys.last_used_at` (written by requests) nor on
`accounts.lock_version` (the hold lock): those change nothing a cache holds.

Revision ID: 0011_principal_stamp
Revises: 0010_operator
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011_principal_stamp"
down_revision = "0010_operator"
branch_labels = None
depends_on = None

_KEY_COLUMNS = (
    "hash, workspace_id, intern_id, name, label, limit_micros, limit_reset, "
    "include_byok_in_limit, disabled, is_management, exempt_free_limits, expires_at, "
    "creator_user_id, external_user"
)
# (table, trigger suffix, event)
TRIGGERS = (
    ("api_keys", "upd", f"UPDATE OF {_KEY_COLUMNS}"),
    ("api_keys", "del", "DELETE"),
    ("workspaces", "upd", "UPDATE"),
    ("workspaces", "del", "DELETE"),
    ("accounts", "upd", "UPDATE OF id, name, credits_purchased_micros, exempt_free_limits"),
    ("accounts", "del", "DELETE"),
    ("guardrails", "ins", "INSERT"),
    ("guardrails", "upd", "UPDATE"),
    ("guardrails", "del", "DELETE"),
    ("guardrail_key_assignments", "ins", "INSERT"),
    ("guardrail_key_assignments", "upd", "UPDATE"),
    ("guardrail_key_assignments", "del", "DELETE"),
)
# An upsert, so that a table emptied by hand (TRUNCATE) starts counting again.
_BUMP = (
    "INSERT INTO principal_stamp (id, version) VALUES (1, 1) "
    "ON CONFLICT (id) DO UPDATE SET version = principal_stamp.version + 1"
)


def _name(table: str, suffix: str) -> str:
    return f"principal_stamp_{table}_{suffix}"


def upgrade() -> None:
    op.create_table(
        "principal_stamp",
        sa.Column("id", sa.Integer(), nullable=False, autoincrement=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.execute("INSERT INTO principal_stamp (id, version) VALUES (1, 0)")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "CREATE FUNCTION principal_stamp_bump() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN {_BUMP}; RETURN NULL; END $$"
        )
        for table, suffix, event in TRIGGERS:
            # Once per statement, not per row: a bulk change bumps it once.
            op.execute(
                f"CREATE TRIGGER {_name(table, suffix)} AFTER {event} ON {table} "
                "FOR EACH STATEMENT EXECUTE FUNCTION principal_stamp_bump()"
            )
    else:
        for table, suffix, event in TRIGGERS:
            op.execute(
                f"CREATE TRIGGER {_name(table, suffix)} AFTER {event} ON {table} BEGIN {_BUMP}; END"
            )


def downgrade() -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    for table, suffix, _event in TRIGGERS:
        on = f" ON {table}" if postgresql else ""
        op.execute(f"DROP TRIGGER IF EXISTS {_name(table, suffix)}{on}")
    if postgresql:
        op.execute("DROP FUNCTION IF EXISTS principal_stamp_bump()")
    op.drop_table("principal_stamp")
