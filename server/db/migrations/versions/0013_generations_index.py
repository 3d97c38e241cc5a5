"""generations index: one (workspace_id, created_at) index instead of three

Every transcription inserts a `generations` row in the writer's batch; each secondary index
is one more B-tree insert (and page written at commit). Every read of the table is one
workspace's rows by time (GET /activity: a date range, GET /generations: newest first) or
one row by id (GET /generation, the primary key); nothing reads or deletes by account or
key alone, and the key filter is applied within a workspace's rows.

Revision ID: 0013_generations_index
Revises: 0012_byok_stamp
Create Date: 2026-11-25
"""

from __future__ import annotations

from alembic import op

revision = "0013_generations_index"
down_revision = "0012_byok_stamp"
branch_labels = None
depends_on = None

_OLD = (
    ("ix_generations_account_id", ["account_id"]),
    ("ix_generations_created_at", ["created_at"]),
    ("ix_generations_key_hash", ["key_hash"]),
)


def upgrade() -> None:
    # Plain CREATE/DROP INDEX on both databases: no table copy is needed.
    op.create_index(
        "ix_generations_workspace_created", "generations", ["workspace_id", "created_at"]
    )
    for name, _columns in _OLD:
        op.drop_index(name, table_name="generations")


def downgrade() -> None:
    for name, columns in _OLD:
        op.create_index(name, "generations", columns)
    op.drop_index("ix_generations_workspace_created", table_name="generations")
