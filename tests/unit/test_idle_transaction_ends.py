"""SQLite sessions that only read end with no COMMIT or ROLLBACK handed to aiosqlite's
thread (server/db/engine.py, IdleEndsSkipped: the dialect's documented do_commit and
do_rollback, overridden in a registered dialect of our own); a session that wrote ends its
transaction as usual and wakes who waits for the pool's write to end (PoolWrites)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects.sqlite.aiosqlite import SQLiteDialect_aiosqlite

from server.db.engine import IdleEndsSkipped, create_engine, pool_writes, session_factory


async def test_only_a_session_that_wrote_ends_its_transaction_on_the_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ended: list[str] = []
    parent_commit = SQLiteDialect_aiosqlite.do_commit
    parent_rollback = SQLiteDialect_aiosqlite.do_rollback

    def commit(self: Any, connection: Any) -> None:
        ended.append("commit")
        parent_commit(self, connection)

    def rollback(self: Any, connection: Any) -> None:
        ended.append("rollback")
        parent_rollback(self, connection)

    monkeypatch.setattr(SQLiteDialect_aiosqlite, "do_commit", commit)
    monkeypatch.setattr(SQLiteDialect_aiosqlite, "do_rollback", rollback)
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}")
    try:
        assert isinstance(engine.sync_engine.dialect, IdleEndsSkipped)
        assert engine.url.get_backend_name() == "sqlite"
        sessions = session_factory(engine)
        async with sessions() as session:
            await (await session.connection()).execute(sa.text("CREATE TABLE t (x INTEGER)"))
            await session.commit()
        ended.clear()
        async with sessions() as session:  # reads only: nothing to end
            await (await session.connection()).execute(sa.text("SELECT count(*) FROM t"))
            await session.commit()
        async with sessions() as session:
            await (await session.connection()).execute(sa.text("SELECT count(*) FROM t"))
        assert ended == []

        writes = pool_writes(engine)
        assert writes is not None
        async with sessions() as session:
            await (await session.connection()).execute(sa.text("INSERT INTO t VALUES (1)"))
            assert writes.writing()
            waiter = asyncio.create_task(writes.ended(at_most=5))
            await asyncio.sleep(0)
            await session.commit()
        await asyncio.wait_for(waiter, timeout=1)  # woken by the commit, not the bound
        assert not writes.writing()
        async with sessions() as session:
            await (await session.connection()).execute(sa.text("INSERT INTO t VALUES (2)"))
            await session.rollback()
        assert ended == ["commit", "rollback"]
        async with sessions() as session:
            assert (
                await (await session.connection()).execute(sa.text("SELECT x FROM t"))
            ).scalars().all() == [1]
    finally:
        await engine.dispose()
