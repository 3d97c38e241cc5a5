"""Fixtures: real databases (a SQLite file, a fresh PostgreSQL database), the real gateway
(gRPC server + Envoy) started with `gateway up`, and an Admin to seed data."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
from sqlmodel import SQLModel

from server import event_loop
from server.db.engine import create_engine, session_factory
from server.db.migrate import upgrade
from server.db.models import LedgerEntry
from testkit import processes
from testkit.admin import Admin, IssuedKey
from testkit.catalog import FAKE_KEY_ENV, write_test_catalog
from testkit.fakes.openai_stt import API_KEY as FAKE_PROVIDER_KEY
from testkit.fakes.openai_stt import FakeSttProvider
from testkit.fakes.video_providers import FakeVideoProviders
from testkit.fakes.webhook_receiver import WebhookReceiver
from testkit.processes import GatewayProcess
from tests.support.moto import moto_s3  # noqa: F401  # the S3 endpoint fixture, for every module

PG_HOST = os.environ.get("GATEWAY_TEST_PG_HOST", "127.0.0.1")
PG_USER = os.environ.get("GATEWAY_TEST_PG_USER", "postgres")
PG_ADMIN_DSN = f"postgresql://{PG_USER}@{PG_HOST}:5432/test"
BACKENDS = ("sqlite", "postgres")


def pytest_configure(config: pytest.Config) -> None:
    """Every async test and fixture runs on the event loop the gateway's processes run on
    (server/event_loop.py): one loop to support. pytest-asyncio makes its loops with the
    current policy (its loop-factory hook parametrizes the async tests only, which tears
    session fixtures down between them and the sync tests that use them)."""
    asyncio.set_event_loop_policy(event_loop.EventLoopPolicy())


# What the end-to-end `stack` runs on: the route, Envoy and gRPC behave the same on either
# database, so SQLite only, unless a test (or its module) is marked `both_backends` because
# the database is its point (exactness under concurrency, holds, stored values, ...).
STACK_BACKENDS = ("sqlite",)


UNIT = Path(__file__).resolve().parent / "unit"


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """`pytest tests/unit` (the in-process layer alone) runs in one process unless `-n` is
    given on the command line: two xdist workers each import the server and build their own
    migrated templates, which cost more than they save there (390 tests: 36 s on `-n 2`,
    25 s on one process)."""
    given = config.invocation_params.args
    if any(a.startswith(("-n", "--numprocesses", "--dist")) for a in given):
        return
    paths = [a.split("::")[0] for a in config.args]
    if paths and all(Path(p).resolve().is_relative_to(UNIT) for p in paths):
        config.option.numprocesses = 0
        config.option.dist = "no"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    chosen = any(
        "stack" in str(mark.args[0]) for mark in metafunc.definition.iter_markers("parametrize")
    )  # a test that names its backends itself
    if "stack" in metafunc.fixturenames and not chosen:
        both = metafunc.definition.get_closest_marker("both_backends") is not None
        backends = BACKENDS if both else STACK_BACKENDS
        metafunc.parametrize("stack", backends, indirect=True, scope="session")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`--dist loadgroup`, see pyproject.toml), tests that share an
    expensive fixture run on one worker, so it starts once rather than once per worker: a
    module's tests when they use a module-scoped fixture (a gateway of their own, a built
    wheel), and the tests of the PostgreSQL `stack`."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("stack") == "postgres":
            # First: a module-scoped fixture on the PostgreSQL stack lives beside it.
            item.add_marker(pytest.mark.xdist_group("stack-postgres"))
            continue
        fixtures = getattr(item, "_fixtureinfo", None)
        definitions = fixtures.name2fixturedefs.values() if fixtures is not None else ()
        if any(d[-1].scope == "module" for d in definitions if d):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))  # type: ignore[attr-defined]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Under `--dist loadgroup` each xdist worker reports a grouped test as `id@group`; a
    pytest that ignores the rewrite spreads the groups over the workers (each starting the
    module's gateways again, a slower run) without a word, so say it, once."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    for item in session.items:
        if item.get_closest_marker("xdist_group") and "@" not in item.nodeid:
            warnings.warn(
                pytest.PytestWarning(
                    "--dist loadgroup is not honoured by this pytest/pytest-xdist pair "
                    f"({item.nodeid} has no @group): modules that share a gateway start it "
                    "on each worker; `pip install '.[test]'` pins pytest<9.2 (pyproject.toml)"
                ),
                stacklevel=1,
            )
            return


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller adds them up
        workeroutput["gateways_started"] = len(processes.STARTED)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: absent under -p no:xdist
def pytest_testnodedown(node: Any) -> None:
    started = getattr(node, "workeroutput", {}).get("gateways_started", 0)
    node.config.stash[_GATEWAYS] = node.config.stash.get(_GATEWAYS, 0) + started


_GATEWAYS = pytest.StashKey[int]()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    started = config.stash.get(_GATEWAYS, 0) + len(processes.STARTED)
    if started:
        terminalreporter.write_line(f"gateways started (`gateway up`): {started}")


async def _admin_connection() -> asyncpg.Connection:
    try:
        return await asyncpg.connect(PG_ADMIN_DSN, timeout=5)
    except (OSError, asyncpg.PostgresError) as exc:
        # PostgreSQL-backed tests are part of the suite: an unreachable server fails them
        # rather than silently skipping them.
        pytest.fail(f"PostgreSQL at {PG_HOST}:5432 is not reachable: {exc}")


async def _create_pg_database(template: str | None = None) -> str:
    name = f"gw_test_{uuid.uuid4().hex[:12]}"
    connection = await _admin_connection()
    try:
        copy = f' TEMPLATE "{template}"' if template else ""
        await connection.execute(f'CREATE DATABASE "{name}"{copy}')
    finally:
        await connection.close()
    return f"postgresql+asyncpg://{PG_USER}@{PG_HOST}:5432/{name}"


async def _drop_pg_database(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    connection = await asyncpg.connect(PG_ADMIN_DSN, timeout=5)
    try:
        await connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await connection.close()


_DROPS_AT_ONCE = 4


class Databases:
    """Creates migrated databases of either backend and drops the PostgreSQL ones at the end.

    Migrations run once per backend and session, on a template: each new SQLite database is
    a copy of the migrated file, each PostgreSQL one `CREATE DATABASE ... TEMPLATE` of the
    migrated template database (0.2 s instead of 1.8 s of migrations). The migrations
    themselves are still tested from an empty database (tests/test_migrations.py downgrades
    to base and upgrades again)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pg_urls: list[str] = []
        self._templates: dict[str, str] = {}  # backend -> migrated template (file or name)
        self._lock = asyncio.Lock()

    async def _template(self, backend: str) -> str:
        async with self._lock:
            if backend not in self._templates:
                if backend == "sqlite":
                    folder = self.root / "sqlite-template"
                    folder.mkdir(parents=True)
                    path = folder / "gateway.db"
                    await upgrade(f"sqlite+aiosqlite:///{path}")
                    self._templates[backend] = str(path)
                else:
                    url = await _create_pg_database()
                    self.pg_urls.append(url)
                    await upgrade(url)
                    self._templates[backend] = url.rsplit("/", 1)[1]
            return self._templates[backend]

    async def new(self, backend: str) -> str:
        template = await self._template(backend)
        if backend == "sqlite":
            folder = self.root / f"sqlite-{secrets.token_hex(4)}"
            folder.mkdir(parents=True)
            shutil.copyfile(template, folder / "gateway.db")
            return f"sqlite+aiosqlite:///{folder / 'gateway.db'}"
        url = await _create_pg_database(template)
        self.pg_urls.append(url)
        return url

    async def close(self) -> None:
        # A few at a time: one by one, dropping a run's databases took seconds at the
        # session's end; all at once, a worker's hundred-odd databases each opened an admin
        # connection together, and with the other worker's gateways still connected that
        # passed PostgreSQL's max_connections (100) - "too many clients", a red CI run.
        room = asyncio.Semaphore(_DROPS_AT_ONCE)

        async def drop(url: str) -> None:
            async with room:
                await _drop_pg_database(url)

        await asyncio.gather(*(drop(url) for url in self.pg_urls))


@pytest_asyncio.fixture(scope="session")
async def databases(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Databases]:
    dbs = Databases(tmp_path_factory.mktemp("databases"))
    yield dbs
    await dbs.close()


@pytest_asyncio.fixture(params=BACKENDS)
async def db_url(request: pytest.FixtureRequest, databases: Databases) -> str:
    """A fresh, migrated database of each backend."""
    return await databases.new(request.param)


@pytest_asyncio.fixture
async def admin_db(db_url: str) -> AsyncIterator[Admin]:
    engine = create_engine(db_url)
    yield Admin(session_factory(engine))
    await engine.dispose()


@pytest.fixture(scope="session")
def fake_stt() -> Iterator[FakeSttProvider]:
    provider = FakeSttProvider().start()
    yield provider
    provider.stop()


@pytest.fixture(scope="session")
def fake_video() -> Iterator[FakeVideoProviders]:
    providers = FakeVideoProviders().start()
    yield providers
    providers.stop()


@pytest.fixture(scope="session")
def webhook_receiver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver(tmp_path_factory.mktemp("webhooks") / "ca.pem").start()
    yield receiver
    receiver.stop()


def gateway_env(catalog: Path, receiver: WebhookReceiver) -> dict[str, str]:
    return {
        "GATEWAY_CATALOG": str(catalog),
        FAKE_KEY_ENV: FAKE_PROVIDER_KEY,
        "FAKE_STT_WRONG_KEY": "not-the-key",
        # The test receiver listens on loopback with a certificate from a test CA.
        "GATEWAY_WEBHOOK_CA_BUNDLE": str(receiver.ca_file),
        "GATEWAY_WEBHOOK_ALLOW_PRIVATE": "1",
        "GATEWAY_REGIONAL_HOSTS": "eu.localhost,eu.gateway.test",
    }


class Stack:
    def __init__(
        self,
        gateway: GatewayProcess,
        admin: Admin,
        fake_stt: FakeSttProvider,
        webhooks: WebhookReceiver,
    ) -> None:
        self.gateway = gateway
        self.admin = admin
        self.fake_stt = fake_stt
        self.webhooks = webhooks
        self.fake_video: FakeVideoProviders | None = None

    @property
    def base_url(self) -> str:
        return self.gateway.base_url

    @property
    def grpc_target(self) -> str:
        return self.gateway.grpc_target


@dataclass
class OwnGateway:
    """A gateway of one test's own (it may stop or signal it), with a funded key."""

    gateway: GatewayProcess
    admin: Admin
    issued: IssuedKey  # a key of a workspace whose account holds 10 USD

    @property
    def port(self) -> int:
        return self.gateway.http_port

    def terminate(self) -> None:
        assert self.gateway.process is not None
        self.gateway.process.send_signal(signal.SIGTERM)

    async def exit_code(self, within: float) -> int:
        assert self.gateway.process is not None
        return await asyncio.to_thread(self.gateway.process.wait, within)

    async def count(self, table: type[SQLModel], *where: Any) -> int:
        return await self.admin.count(table, *where)

    async def charges(self) -> int:
        account = self.issued.workspace.account_id
        return await self.count(
            LedgerEntry, LedgerEntry.account_id == account, LedgerEntry.kind == "charge"
        )


@contextlib.asynccontextmanager
async def own_gateway(
    databases: Databases,
    backend: str,
    folder: Path,
    fake_stt: FakeSttProvider,
    receiver: WebhookReceiver,
    env: dict[str, str] | None = None,
) -> AsyncIterator[OwnGateway]:
    """`gateway up` on a fresh database of `backend` with the test catalog, plus `env`."""
    url = await databases.new(backend)
    catalog = write_test_catalog(folder / "catalog.toml", fake_stt.base_url)
    gateway = GatewayProcess(
        data_dir=folder / "gw",
        database_url=url,
        extra_env={**gateway_env(catalog, receiver), **(env or {})},
    )
    await asyncio.to_thread(gateway.start)
    engine = create_engine(url)
    try:
        admin = Admin(session_factory(engine))
        workspace = await admin.workspace("own")
        await admin.credits(workspace, "10")
        yield OwnGateway(gateway, admin, await admin.key(workspace))
    finally:
        await engine.dispose()
        await asyncio.to_thread(gateway.stop)


@pytest_asyncio.fixture(scope="session")
async def stack(
    request: pytest.FixtureRequest,
    databases: Databases,
    tmp_path_factory: pytest.TempPathFactory,
    fake_stt: FakeSttProvider,
    webhook_receiver: WebhookReceiver,
    fake_video: FakeVideoProviders,
) -> AsyncIterator[Stack]:
    """The real gateway (server + Envoy), shared by the tests of a session, with a catalog of
    fake providers on loopback: on SQLite, and on PostgreSQL too for tests marked
    `both_backends` (see pytest_generate_tests)."""
    url = await databases.new(request.param)
    data_dir = tmp_path_factory.mktemp(f"stack-{request.param}")
    catalog = write_test_catalog(data_dir / "catalog.toml", fake_stt.base_url, fake_video.base)
    gateway = GatewayProcess(
        data_dir=data_dir, database_url=url, extra_env=gateway_env(catalog, webhook_receiver)
    )
    await asyncio.to_thread(gateway.start)
    engine = create_engine(url)
    try:
        stack = Stack(gateway, Admin(session_factory(engine)), fake_stt, webhook_receiver)
        stack.fake_video = fake_video
        yield stack
    finally:
        await engine.dispose()
        await asyncio.to_thread(gateway.stop)


@pytest.fixture
def unique() -> Iterator[str]:
    yield secrets.token_hex(4)


@pytest_asyncio.fixture
async def funded(stack: Stack, unique: str) -> IssuedKey:
    """A key of a new workspace whose account holds 100 USD."""
    workspace = await stack.admin.workspace(f"funded-{unique}")
    await stack.admin.credits(workspace, "100")
    return await stack.admin.key(workspace, "funded")


@pytest_asyncio.fixture
async def pg_database(databases: Databases) -> str:
    """A fresh, migrated PostgreSQL database."""
    return await databases.new("postgres")
