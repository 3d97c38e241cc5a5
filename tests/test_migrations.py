"""Alembic migrations build exactly the schema the models describe, on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlmodel import SQLModel

from server.db import models  # noqa: F401
from server.db.engine import create_engine
from server.db.migrate import upgrade, upgrade_sync


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
