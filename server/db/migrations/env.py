"""Alembic environment: async engines for SQLite (aiosqlite) and PostgreSQL (asyncpg)."""

from __future__ import annotations

import asyncio

import sqlalchemy as sa
from alembic import context
from sqlalchemy.engine import Connection
from sqlmodel import SQLModel

from server.db import models  # noqa: F401  (registers the tables on SQLModel.metadata)
from server.db.engine import create_engine

target_metadata = SQLModel.metadata
# PostgreSQL: processes that migrate one database at once (on Kubernetes the migration Job
# and every replica start together) take turns. The lock is held until the migrations'
# transaction ends, and alembic reads the database's revision only after it is taken, so
# the next in turn finds the schema at head and does nothing. A fixed key: "gateway1".
MIGRATION_LOCK_KEY = 0x6761746577617931


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            connection.execute(
                sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY}
            )
        context.run_migrations()


async def _run_async() -> None:
    engine = create_engine(context.config.get_main_option("sqlalchemy.url") or "")
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run)
            await connection.commit()
    finally:
        await engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (SQL script) migrations are not supported; run against a database")
asyncio.run(_run_async())
