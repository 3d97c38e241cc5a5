"""Alembic migrations build exactly the schema the models describe, on SQLite and PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlmodel import SQLModel

from server.db import models  # noqa: F401
from server.db.engine import create_engine
from server.db.migrate import MigrationFailed, upgrade, upgrade_sync
from server.db.models import RateWindow, UtcDateTime


async def test_migrated_schema_matches_the_models(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        async with engine.connect() as connection:

            def diff(sync_connection: Any) -> list[Any]:
                context = MigrationContext.configure(sync_connection, opts={"compare_type": True})
                return compare_metadata(context, SQLModel.metadata)

            differences = await connection.run_sync(diff)
    finally:
        await engine.dispose()
    assert differences == []


async def test_upgrade_is_idempotent_and_downgrade_works(db_url: str) -> None:
    await upgrade(db_url)  # already at head: nothing to do
    import asyncio

    from alembic import command

    from server.db.migrate import alembic_config

    await asyncio.to_thread(command.downgrade, alembic_config(db_url), "base")
    engine = create_engine(db_url)
    try:
        async with engine.connect() as connection:
            tables = await connection.run_sync(lambda c: sa.inspect(c).get_table_names())
        assert set(tables) <= {"alembic_version"}
    finally:
        await engine.dispose()
    await asyncio.to_thread(upgrade_sync, db_url)


async def test_0007_moves_daily_free_counts_into_rate_windows_and_back(db_url: str) -> None:
    """The daily `:free` count (usage_counters.free_requests) becomes a 'day' window beside
    the minute windows, and the downgrade puts it back."""
    import asyncio

    from alembic import command

    from server.db.migrate import alembic_config

    config = alembic_config(db_url)
    await asyncio.to_thread(command.downgrade, config, "0006")
    minute = datetime(2026, 7, 1, 12, 30, tzinfo=UTC)
    engine = create_engine(db_url)
    try:
        async with engine.begin() as connection:
            old_windows = sa.table(
                "rate_windows",
                sa.column("subject_id"),
                sa.column("window_start", UtcDateTime()),
                sa.column("count"),
            )
            counters = sa.table(
                "usage_counters",
                *(sa.column(c) for c in ("subject", "subject_id", "period", "spend_micros")),
                sa.column("period_start", sa.Date()),
                sa.column("byok_micros"),
                sa.column("free_requests"),
            )
            await connection.execute(
                sa.insert(old_windows).values(subject_id="acct", window_start=minute, count=7)
            )
            await connection.execute(
                sa.insert(counters).values(
                    subject="account",
                    subject_id="acct",
                    period="day",
                    period_start=date(2026, 7, 1),
                    spend_micros=5,
                    byok_micros=0,
                    free_requests=42,
                )
            )
        await asyncio.to_thread(upgrade_sync, db_url)
        async with engine.connect() as connection:
            rows = (
                await connection.execute(
                    sa.select(RateWindow.period, RateWindow.window_start, RateWindow.count)  # type: ignore[call-overload]
                    .where(RateWindow.subject_id == "acct")
                    .order_by(RateWindow.period)
                )
            ).all()
        assert [tuple(r) for r in rows] == [
            ("day", datetime(2026, 7, 1, tzinfo=UTC), 42),
            ("minute", minute, 7),
        ]
        await asyncio.to_thread(command.downgrade, config, "0006")
        async with engine.connect() as connection:
            back = (
                await connection.execute(
                    sa.select(counters.c.free_requests, counters.c.spend_micros).where(
                        counters.c.subject_id == "acct"
                    )
                )
            ).all()
            windows = (await connection.execute(sa.select(old_windows.c.count))).all()
        assert [tuple(r) for r in back] == [(42, 5)] and [tuple(r) for r in windows] == [(7,)]
    finally:
        await engine.dispose()
        await asyncio.to_thread(upgrade_sync, db_url)


def test_head_revision_is_alembic_s_head() -> None:
    from alembic.script import ScriptDirectory

    from server.db.migrate import HEAD_REVISION, alembic_config

    assert (
        ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head() == HEAD_REVISION
    )


def test_migrations_run_in_a_child_process_alembic_never_loads_here(tmp_path: Path) -> None:
    """A new database is migrated by `python -m server.db.migrate`: the calling process (a
    server) never imports alembic; a database at head costs one query."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}"
    script = (
        "import asyncio, sys\n"
        "from server.db.migrate import HEAD_REVISION, current_revision, upgrade\n"
        f"asyncio.run(upgrade({url!r}))\n"
        f"assert asyncio.run(current_revision({url!r})) == HEAD_REVISION\n"
        f"asyncio.run(upgrade({url!r}))  # at head: nothing to do\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'alembic'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


async def test_a_failed_migration_says_why(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        async with engine.begin() as connection:
            await connection.execute(sa.text("UPDATE alembic_version SET version_num = '9999_x'"))
    finally:
        await engine.dispose()
    with pytest.raises(MigrationFailed, match=r"the database migrations failed: .*9999_x"):
        await upgrade(db_url)
