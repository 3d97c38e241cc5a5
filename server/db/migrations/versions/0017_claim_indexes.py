"""claim indexes: a claim steps through workspaces instead of walking a capped one's rows

The video and webhook claims take a row only from a workspace below its cap of rows in
flight. They used to walk the ready rows in due order and skip those of capped workspaces:
20,000 due deliveries of one workspace stuck behind a slow receiver made every claim of
every process scan all of them (12.5 ms each on SQLite, holding its write lock). The claim
now steps from one workspace with ready rows to the next and seeks each one's earliest due
row (status, workspace_id, due), and finds the capped workspaces from the leases in force
(lease_expires_at): its cost follows the number of workspaces, not of rows
(server/workers/leases.py).

Revision ID: 0017_claim_indexes
Revises: 0016_agreements
Create Date: 2026-11-28
"""

from __future__ import annotations

from alembic import op

revision = "0017_claim_indexes"
down_revision = "0016_agreements"
branch_labels = None
depends_on = None

INDEXES = (
    ("ix_video_jobs_workspace_due", "video_jobs", ["status", "workspace_id", "next_run_at"]),
    ("ix_video_jobs_lease", "video_jobs", ["lease_expires_at"]),
    (
        "ix_webhook_deliveries_workspace_due",
        "webhook_deliveries",
        ["status", "workspace_id", "next_attempt_at"],
    ),
    ("ix_webhook_deliveries_lease", "webhook_deliveries", ["lease_expires_at"]),
)


def upgrade() -> None:
    for name, table, columns in INDEXES:
        op.create_index(name, table, columns)


def downgrade() -> None:
    for name, table, _columns in reversed(INDEXES):
        op.drop_index(name, table_name=table)
