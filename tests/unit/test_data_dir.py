"""The data dir (issue 29, items 7 and 9), in-process: private modes whatever the umask, and
the database it belongs to remembered, so that a command given the data dir with another
database is refused instead of creating a second database and keys the gateway rejects."""

from __future__ import annotations

import logging
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from server.db.engine import create_engine
from server.vault.crypto import load_master_key
from tests.support.cli import Ran, gateway

pytestmark = pytest.mark.usefixtures("as_an_operator")


@pytest.fixture
def no_umask() -> Iterator[None]:
    """The loosest umask: everything created is as open as its creator asks."""
    previous = os.umask(0)
    yield
    os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --- item 7: modes ----------------------------------------------------------------------


async def test_a_new_data_dir_and_its_files_are_private_whatever_the_umask(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_umask: None
) -> None:
    data = tmp_path / "data"
    ran = await gateway(capsys, "migrate", "--data-dir", str(data))
    assert ran.returncode == 0, ran.stderr
    assert mode(data) == 0o700
    for name in ("gateway.db", "operator-key", "database"):
        assert mode(data / name) == 0o600, name


async def test_sqlite_gives_wal_and_shm_the_database_file_s_private_mode(
    tmp_path: Path, no_umask: None
) -> None:
    path = tmp_path / "gateway.db"
    engine = create_engine(f"sqlite+aiosqlite:///{path}")
    try:
        async with engine.begin() as connection:
            await connection.execute(sa.text("CREATE TABLE t (x TEXT)"))
            await connection.execute(sa.text("INSERT INTO t VALUES ('x')"))
        async with engine.connect() as connection:  # held open: -wal and -shm exist
            await connection.execute(sa.text("SELECT * FROM t"))
            for name in ("gateway.db", "gateway.db-wal", "gateway.db-shm"):
                assert mode(tmp_path / name) == 0o600, name
    finally:
        await engine.dispose()


def test_the_vault_master_key_s_data_dir_is_created_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_umask: None
) -> None:
    monkeypatch.delenv("GATEWAY_VAULT_MASTER_KEY", raising=False)
    data = tmp_path / "fresh"
    load_master_key(data)
    assert mode(data) == 0o700
    assert mode(data / "vault-master.key") == 0o600


async def test_an_existing_data_dir_with_loose_modes_is_tightened_and_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], migrated_sqlite: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    shutil.copyfile(migrated_sqlite, data / "gateway.db")
    (data / "operator-key").write_text("sk-gw-op-" + "0" * 64 + "\n")
    load_master_key(tmp_path / "k")
    shutil.copyfile(tmp_path / "k" / "vault-master.key", data / "vault-master.key")
    os.chmod(data, 0o755)
    for name in ("gateway.db", "operator-key", "vault-master.key"):
        os.chmod(data / name, 0o644)
    said: list[str] = []
    heard = logging.Handler()
    heard.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    # On the module's logger: main replaces the root's handlers (and writes in a thread).
    logging.getLogger("gateway.datadir").addHandler(heard)
    try:
        ran = await gateway(capsys, "keys", "list", "--data-dir", str(data))
    finally:
        logging.getLogger("gateway.datadir").removeHandler(heard)
    assert ran.returncode == 0, ran.stderr
    assert mode(data) == 0o700
    for name in ("gateway.db", "operator-key", "vault-master.key"):
        assert mode(data / name) == 0o600, name
    assert any(f"{data} was mode 0o755: tightened to 0o700" in line for line in said), said
    assert any(
        f"{data / 'operator-key'} was mode 0o644: tightened to 0o600" in line for line in said
    ), said


# --- item 9: the database a data dir belongs to ---------------------------------------


def _refused(ran: Ran, *needles: str) -> str:
    assert ran.returncode != 0, ran.stdout
    assert "Traceback" not in ran.stderr + ran.stdout
    last = ran.stderr.strip().splitlines()[-1]
    for needle in needles:
        assert needle in last, ran.stderr
    return last


# Every command taking --data-dir that touches the database, with its own arguments.
COMMANDS = [
    ("operator-key", "rotate"),
    ("migrate",),
    ("keys", "list"),
    ("keys", "create", "--name", "k"),
    ("credits", "add", "--amount", "1"),
    ("workspaces", "create", "acme"),
    ("workspaces", "webhook-secret", "default"),
    ("vault", "rotate-master-key"),
    ("guardrails", "list"),
    ("byok", "list"),
    ("serve", "--grpc-port", "0"),
    ("up", "--http-port", "0", "--grpc-port", "0"),
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
async def test_a_postgresql_gateway_s_data_dir_refuses_the_embedded_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pg_database: str, command: tuple[str, ...]
) -> None:
    data = tmp_path / "data"
    plain = pg_database.replace("postgresql+asyncpg://", "postgresql://")
    first = await gateway(capsys, "migrate", "--data-dir", str(data), "--database-url", plain)
    assert first.returncode == 0, first.stderr
    key = (data / "operator-key").read_text()
    name = pg_database.rsplit("/", 1)[1]

    ran = await gateway(capsys, *command, "--data-dir", str(data))  # no --database-url
    assert not (data / "gateway.db").exists()
    assert (data / "operator-key").read_text() == key  # the running gateway's key stays
    _refused(
        ran, f"postgresql://postgres@127.0.0.1:5432/{name}", "sqlite:gateway.db", "--database-url"
    )
    assert f"postgresql://postgres@127.0.0.1:5432/{name}" in (data / "database").read_text()


async def test_a_data_dir_from_before_the_record_with_keys_but_no_database_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pg_database: str
) -> None:
    data = tmp_path / "data"
    plain = pg_database.replace("postgresql+asyncpg://", "postgresql://")
    assert (
        await gateway(capsys, "migrate", "--data-dir", str(data), "--database-url", plain)
    ).returncode == 0
    (data / "database").unlink()  # as an older gateway left it
    key = (data / "operator-key").read_text()
    ran = await gateway(capsys, "operator-key", "rotate", "--data-dir", str(data))
    _refused(ran, "holds keys but no gateway.db", "--database-url")
    assert (data / "operator-key").read_text() == key
    assert not (data / "gateway.db").exists()
    # With its database named, it works, and is remembered from then on.
    again = await gateway(
        capsys, "operator-key", "rotate", "--data-dir", str(data), "--database-url", plain
    )
    assert again.returncode == 0, again.stderr
    assert (data / "database").exists()


async def test_the_record_never_holds_a_password_and_the_same_database_is_accepted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pg_database: str
) -> None:
    data = tmp_path / "data"
    with_password = pg_database.replace("postgres@", "postgres:hunter2@")
    assert "hunter2" in with_password
    first = await gateway(
        capsys, "migrate", "--data-dir", str(data), "--database-url", with_password
    )
    assert first.returncode == 0, first.stderr
    assert "hunter2" not in (data / "database").read_text()
    # The same database, written another way (no password, the plain scheme): accepted.
    plain = pg_database.replace("postgresql+asyncpg://", "postgres://")
    ran = await gateway(capsys, "keys", "list", "--data-dir", str(data), "--database-url", plain)
    assert ran.returncode == 0, ran.stderr


async def test_an_embedded_data_dir_refuses_another_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    assert (await gateway(capsys, "migrate", "--data-dir", str(data))).returncode == 0
    assert "sqlite:gateway.db" in (data / "database").read_text()
    other = tmp_path / "other.db"
    ran = await gateway(
        capsys,
        "keys",
        "list",
        "--data-dir",
        str(data),
        "--database-url",
        f"sqlite:///{other}",
    )
    _refused(ran, "sqlite:gateway.db", f"sqlite:///{other}", "--database-url")
    assert not other.exists()
    # Moved elsewhere, the embedded data dir is still its own database's.
    moved = tmp_path / "moved"
    data.rename(moved)
    assert (await gateway(capsys, "keys", "list", "--data-dir", str(moved))).returncode == 0


async def test_a_mistyped_database_url_is_not_remembered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    ran = await gateway(
        capsys,
        "keys",
        "list",
        "--data-dir",
        str(data),
        "--database-url",
        "postgresql://postgres@127.0.0.1:5432/no_such_database_here",
    )
    assert ran.returncode != 0
    assert not (data / "database").exists()
