"""Webhook signing secrets sealed at rest (issue 29, item 7): never in clear in the database
(the SQLite files' bytes, the PostgreSQL table), the value `gateway workspaces
webhook-secret` prints unchanged, and secrets an older gateway stored in clear sealed by the
next start with their value kept (receivers' signatures keep verifying)."""

from __future__ import annotations

import asyncio
import os
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command

from server.db.engine import create_engine
from server.db.migrate import alembic_config
from server.webhooks.secrets import new_secret
from tests.support.cli import gateway

pytestmark = pytest.mark.usefixtures("as_an_operator")

BEFORE = "0013_generations_index"  # the last revision that kept the secret in clear


def sqlite_bytes(data: Path) -> bytes:
    """Everything SQLite keeps of the database on disk."""
    return b"".join(
        (data / name).read_bytes()
        for name in ("gateway.db", "gateway.db-wal", "gateway.db-shm")
        if (data / name).exists()
    )


async def pg_rows(url: str) -> str:
    """Every row of the workspaces table (each column) as PostgreSQL prints it."""
    engine = create_engine(url)
    try:
        async with engine.connect() as connection:
            rows = await connection.execute(sa.text("SELECT w::text FROM workspaces w"))
            return "\n".join(str(row[0]) for row in rows)
    finally:
        await engine.dispose()


async def legacy_workspace(url: str, name: str) -> str:
    """The database as a gateway before 0014 left it: a workspace whose signing secret is
    in clear. Returns the secret."""
    await asyncio.to_thread(command.downgrade, alembic_config(url), BEFORE)
    secret = new_secret()
    now = datetime.now(UTC)
    engine = create_engine(url)
    try:
        async with engine.begin() as connection:
            await connection.execute(
                sa.text(
                    "INSERT INTO accounts (id, name, credits_purchased_micros, "
                    "exempt_free_limits, lock_version, created_at) "
                    "VALUES (:a, :n, 0, false, 0, :t)"
                ),
                {"a": f"acct_{name}", "n": name, "t": now},
            )
            await connection.execute(
                sa.text(
                    "INSERT INTO workspaces (id, account_id, name, intern_programme, "
                    "vault_writes_disabled, webhook_secret, created_at) "
                    "VALUES (:w, :a, :n, false, false, :s, :t)"
                ),
                {"w": f"ws_{name}", "a": f"acct_{name}", "n": name, "s": secret, "t": now},
            )
    finally:
        await engine.dispose()
    return secret


def _clear_forms(secret: str) -> list[bytes]:
    """The secret as a database could hold it in clear: its text, and its base64 part."""
    return [secret.encode(), secret.removeprefix("whsec_").encode()]


async def test_a_new_secret_is_never_stored_in_clear_and_survives_a_master_key_rotation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], migrated_sqlite: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    shutil.copyfile(migrated_sqlite, data / "gateway.db")
    assert (
        await gateway(capsys, "workspaces", "create", "acme", "--data-dir", str(data))
    ).returncode == 0
    first = await gateway(capsys, "workspaces", "webhook-secret", "acme", "--data-dir", str(data))
    assert first.returncode == 0, first.stderr
    secret = first.stdout.strip().splitlines()[-1]
    assert secret.startswith("whsec_")
    for form in _clear_forms(secret):
        assert form not in sqlite_bytes(data)
    rotated = await gateway(capsys, "vault", "rotate-master-key", "--data-dir", str(data))
    assert rotated.returncode == 0, rotated.stderr
    again = await gateway(capsys, "workspaces", "webhook-secret", "acme", "--data-dir", str(data))
    assert again.stdout.strip().splitlines()[-1] == secret


async def test_an_older_gateway_s_clear_secrets_are_sealed_on_sqlite_keeping_their_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], migrated_sqlite: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    shutil.copyfile(migrated_sqlite, data / "gateway.db")
    url = f"sqlite+aiosqlite:///{data / 'gateway.db'}"
    secret = await legacy_workspace(url, "old")
    assert secret.encode() in sqlite_bytes(data)  # as the older gateway left it

    migrated = await gateway(capsys, "migrate", "--data-dir", str(data))
    assert migrated.returncode == 0, migrated.stderr
    assert "Sealed 1 webhook signing secrets" in migrated.stdout
    for form in _clear_forms(secret):
        assert form not in sqlite_bytes(data)
    printed = await gateway(capsys, "workspaces", "webhook-secret", "old", "--data-dir", str(data))
    assert printed.stdout.strip().splitlines()[-1] == secret  # receivers keep verifying
    assert (data / "vault-master.key").exists() and os.stat(
        data / "vault-master.key"
    ).st_mode & 0o077 == 0


async def test_an_older_gateway_s_clear_secrets_are_sealed_on_postgresql(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pg_database: str
) -> None:
    data = tmp_path / "data"
    secret = await legacy_workspace(pg_database, "old")
    assert secret in await pg_rows(pg_database)
    plain = pg_database.replace("postgresql+asyncpg://", "postgresql://")
    flags = ("--data-dir", str(data), "--database-url", plain)

    migrated = await gateway(capsys, "migrate", *flags)
    assert migrated.returncode == 0, migrated.stderr
    stored = await pg_rows(pg_database)
    for form in _clear_forms(secret):
        assert form.decode() not in stored
    printed = await gateway(capsys, "workspaces", "webhook-secret", "old", *flags)
    assert printed.stdout.strip().splitlines()[-1] == secret
    created = await gateway(capsys, "workspaces", "create", "new", *flags)
    assert created.returncode == 0, created.stderr
    fresh = await gateway(capsys, "workspaces", "webhook-secret", "new", *flags)
    new = fresh.stdout.strip().splitlines()[-1]
    assert new.startswith("whsec_") and new not in await pg_rows(pg_database)
