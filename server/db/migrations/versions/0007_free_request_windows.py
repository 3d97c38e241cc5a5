"""free-model request windows: the UTC minute and the UTC day in one table

The daily count of `:free` requests moves from usage_counters.free_requests (account/day
rows) to rate_windows rows of period 'day' (window_start: that day's midnight, UTC), beside
the per-minute windows, so that one statement counts a request in both.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def _windows_table(name: str, *, with_period: bool) -> None:
    columns: list[sa.Column] = [sa.Column("subject_id", sa.String(length=64), nullable=False)]
    if with_period:
        columns.append(sa.Column("period", sa.String(length=8), nullable=False))
    columns += [
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
    ]
    keys = (
        ["subject_id", "period", "window_start"] if with_period else ["subject_id", "window_start"]
    )
    op.create_table(name, *columns, sa.PrimaryKeyConstraint(*keys, name=f"{name}_pkey"))


def _replace_windows(dialect: str) -> None:
    """rate_windows_next takes the place (and the key's name) of rate_windows."""
    op.drop_table("rate_windows")
    op.rename_table("rate_windows_next", "rate_windows")
    if dialect == "postgresql":
        op.execute(
            "ALTER TABLE rate_windows RENAME CONSTRAINT rate_windows_next_pkey TO rate_windows_pkey"
        )


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    midnight = (  # usage_counters.period_start as that day's midnight, UTC
        "period_start || ' 00:00:00.000000'"  # SQLAlchemy's text format of a DateTime
        if dialect == "sqlite"
        else "period_start::timestamp AT TIME ZONE 'UTC'"
    )
    _windows_table("rate_windows_next", with_period=True)
    op.execute(
        "INSERT INTO rate_windows_next (subject_id, period, window_start, count) "
        "SELECT subject_id, 'minute', window_start, count FROM rate_windows"
    )
    op.execute(
        "INSERT INTO rate_windows_next (subject_id, period, window_start, count) "
        f"SELECT subject_id, 'day', {midnight}, free_requests FROM usage_counters "
        "WHERE subject = 'account' AND period = 'day' AND free_requests > 0"
    )
    _replace_windows(dialect)
    with op.batch_alter_table("usage_counters") as batch_op:
        batch_op.drop_column("free_requests")


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    day = (
        "date(w.window_start)"
        if dialect == "sqlite"
        else "(w.window_start AT TIME ZONE 'UTC')::date"
    )
    with op.batch_alter_table("usage_counters") as batch_op:
        batch_op.add_column(
            sa.Column("free_requests", sa.Integer(), nullable=False, server_default="0")
        )
    # A day with free requests and no spend has no counter row: create it, then fill it.
    op.execute(
        "INSERT INTO usage_counters (subject, subject_id, period, period_start, spend_micros, "
        f"byok_micros, free_requests) SELECT 'account', w.subject_id, 'day', {day}, 0, 0, 0 "
        "FROM rate_windows w WHERE w.period = 'day' AND NOT EXISTS (SELECT 1 FROM "
        "usage_counters c WHERE c.subject = 'account' AND c.subject_id = w.subject_id "
        f"AND c.period = 'day' AND c.period_start = {day})"
    )
    same_day = (
        "w.period = 'day' AND w.subject_id = usage_counters.subject_id "
        f"AND {day} = usage_counters.period_start"
    )
    op.execute(
        f"UPDATE usage_counters SET free_requests = (SELECT w.count FROM rate_windows w WHERE "
        f"{same_day}) WHERE subject = 'account' AND period = 'day' AND EXISTS (SELECT 1 FROM "
        f"rate_windows w WHERE {same_day})"
    )
    _windows_table("rate_windows_next", with_period=False)
    op.execute(
        "INSERT INTO rate_windows_next (subject_id, window_start, count) "
        "SELECT subject_id, window_start, count FROM rate_windows WHERE period = 'minute'"
    )
    _replace_windows(dialect)
