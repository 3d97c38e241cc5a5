"""Several processes migrating one new PostgreSQL database at once — on Kubernetes the
migration Job and every `gateway serve` replica start together, and each applies the
migrations it finds missing — end with one schema at head and every process started."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from server.db.engine import create_engine
from server.db.migrate import HEAD_REVISION, MigrationFailed, upgrade
from tests.conftest import Databases, _create_pg_database


async def test_concurrent_upgrades_of_a_new_database_all_succeed(databases: Databases) -> None:
    url = await _create_pg_database()  # empty: no alembic_version yet
    databases.pg_urls.append(url)  # dropped at the session's end
    outcomes = await asyncio.gather(*(upgrade(url) for _ in range(3)), return_exceptions=True)
    assert [o for o in outcomes if isinstance(o, BaseException)] == []
    engine = create_engine(url)
    try:
        async with engine.connect() as connection:
            versions = (
                await connection.execute(sa.text("SELECT version_num FROM alembic_version"))
            ).all()
    finally:
        await engine.dispose()
    assert [row[0] for row in versions] == [HEAD_REVISION]


async def test_a_database_error_in_a_migration_is_named(databases: Databases) -> None:
    """The error names what the database said, not SQLAlchemy's trailing link line."""
    url = await _create_pg_database()
    databases.pg_urls.append(url)
    engine = create_engine(url)
    try:
        async with engine.begin() as connection:  # in the way of the first migration
            await connection.execute(sa.text("CREATE TABLE accounts (x int)"))
    finally:
        await engine.dispose()
    with pytest.raises(MigrationFailed) as failed:
        await upgrade(url)
    message = str(failed.value)
    assert message.startswith("the database migrations failed: ")
    assert 'relation "accounts" already exists' in message
    assert "Background on this error" not in message
