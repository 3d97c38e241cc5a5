"""The in-process layer: the domain objects (Transcriber, VideoWorker, the webhook
dispatcher, admission, the catalog) built here, on a migrated database, a ManualClock and
providers played by httpx.MockTransport. No subprocess, no Envoy, no sockets (PostgreSQL
aside): `pytest tests/unit` runs alone in seconds."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine
from sqlmodel import SQLModel

from server.clock import ManualClock
from server.db.engine import create_engine, session_factory
from server.db.migrate import upgrade
from server.db.models import Account  # noqa: F401 (registers every table on the metadata)
from server.db.writer import Writer
from server.limits.leases import BudgetLeases
from server.observability.metrics import Metrics
from testkit.admin import Admin
from testkit.domain import (
    PROVIDER_KEY,
    PROVIDER_KEY_ENV,
    Domain,
    ScriptedProviders,
    start_clock,
    unit_catalog,
)
from tests.conftest import Databases


@pytest_asyncio.fixture(scope="session")
async def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One migrated SQLite file; each test gets a copy (a copy is faster than migrating)."""
    path = tmp_path_factory.mktemp("unit-template") / "gateway.db"
    await upgrade(f"sqlite+aiosqlite:///{path}")
    return path


@pytest.fixture
def clock() -> ManualClock:
    return start_clock()


async def _domain(url: str, dialect: str, clock: ManualClock, folder: Path) -> Domain:
    engine = create_engine(url)
    sessions = session_factory(engine)
    providers = ScriptedProviders()
    http = httpx.AsyncClient(transport=httpx.MockTransport(providers.handle))
    writer = Writer(sessions)
    metrics = Metrics()
    return Domain(
        sessions=sessions,
        writer=writer,
        clock=clock,
        catalog=unit_catalog(folder),
        providers=providers,
        http=http,
        metrics=metrics,
        admin=Admin(sessions, clock),
        dialect=dialect,
        leases=BudgetLeases(writer, clock, metrics),
    )


async def _close(domain: Domain) -> None:
    await domain.settlements.close(5.0)
    if domain.leases is not None:
        await domain.leases.close()
    await domain.writer.close()
    await domain.http.aclose()
    bind = domain.sessions.kw["bind"]
    await bind.dispose()


@pytest.fixture(autouse=True)
def provider_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PROVIDER_KEY_ENV, PROVIDER_KEY)


@pytest_asyncio.fixture
async def domain(
    migrated_sqlite: Path, clock: ManualClock, tmp_path: Path
) -> AsyncIterator[Domain]:
    """The domain on a fresh SQLite database."""
    path = tmp_path / "gateway.db"
    shutil.copyfile(migrated_sqlite, path)
    built = await _domain(f"sqlite+aiosqlite:///{path}", "sqlite", clock, tmp_path)
    yield built
    await _close(built)


@pytest_asyncio.fixture(scope="session")
async def unit_pg_url(databases: Databases) -> str:
    """One migrated PostgreSQL database for the layer, emptied before each test that uses
    it (creating and dropping one per test would cost a second or two each)."""
    return await databases.new("postgres")


async def _emptied(url: str) -> str:
    tables = ", ".join(f'"{t.name}"' for t in SQLModel.metadata.sorted_tables)
    engine = create_async_engine(url)
    try:
        async with engine.begin() as connection:
            await connection.execute(sa.text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
    finally:
        await engine.dispose()
    return url


@pytest_asyncio.fixture(params=["sqlite", "postgres"])
async def any_domain(
    request: pytest.FixtureRequest,
    migrated_sqlite: Path,
    unit_pg_url: str,
    clock: ManualClock,
    tmp_path: Path,
) -> AsyncIterator[Domain]:
    """The domain on each backend: for what the dialect decides (leases, counting)."""
    if request.param == "sqlite":
        path = tmp_path / "gateway.db"
        shutil.copyfile(migrated_sqlite, path)
        url = f"sqlite+aiosqlite:///{path}"
    else:
        url = await _emptied(unit_pg_url)
    built = await _domain(url, request.param, clock, tmp_path)
    yield built
    await _close(built)


@pytest_asyncio.fixture
async def pg_domain(unit_pg_url: str, clock: ManualClock, tmp_path: Path) -> AsyncIterator[Domain]:
    """The domain on PostgreSQL only: for what only PostgreSQL does (limits/free_gate.py)."""
    built = await _domain(await _emptied(unit_pg_url), "postgres", clock, tmp_path)
    yield built
    await _close(built)


@pytest.fixture
def as_an_operator(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """For a test running the `gateway` command in-process (tests/support/cli.py): no
    database URL or master key from the environment; the root logger (main routes every
    logger to stderr, as the command does) and the umask as they were afterwards."""
    monkeypatch.delenv("GATEWAY_DATABASE_URL", raising=False)
    monkeypatch.delenv("GATEWAY_VAULT_MASTER_KEY", raising=False)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    umask = os.umask(0o022)
    os.umask(umask)
    yield
    os.umask(umask)
    root.handlers[:] = handlers
    root.setLevel(level)
