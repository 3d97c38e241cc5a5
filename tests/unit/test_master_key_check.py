"""One vault master key per database (issue 30, item 3): the database keeps a check value of
the master key (never the key); the first process stores it, every later one compares its
own before serving or sealing, and a process with another key refuses with one line naming
GATEWAY_VAULT_MASTER_KEY and the key file it used. On both backends (`db_url`), and through
the CLI in-process on SQLite."""

from __future__ import annotations

import asyncio
import base64
import shutil
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import pytest_asyncio
import sqlalchemy as sa

from server.db.engine import SessionFactory, create_engine, session_factory
from server.db.models import VaultKey
from server.errors import GatewayError
from server.vault import keycheck, store
from server.vault.crypto import MasterKey
from tests.support.cli import Ran, gateway

pytestmark = pytest.mark.usefixtures("as_an_operator")

KEY_A = b"\x0a" * 32
KEY_B = b"\x0b" * 32
NOW = datetime(2026, 11, 27, 21, 0, tzinfo=UTC)


def key_forms(key: bytes) -> list[str]:
    """How a key could leak into a value or a message."""
    return [base64.b64encode(key).decode(), key.hex()]


@pytest_asyncio.fixture
async def sessions(db_url: str) -> AsyncIterator[SessionFactory]:
    engine = create_engine(db_url)
    yield session_factory(engine)
    await engine.dispose()


async def stored(sessions: SessionFactory) -> str | None:
    async with sessions() as session:
        return await keycheck.stored_check(session)


async def vault_key_count(sessions: SessionFactory) -> int:
    async with sessions() as session:
        return len((await session.exec(sa.select(VaultKey.vault_id))).all())  # type: ignore[call-overload]


async def test_the_first_process_stores_the_check_value_once_and_the_same_key_passes(
    sessions: SessionFactory,
) -> None:
    master = MasterKey(KEY_A)
    assert await stored(sessions) is None
    await keycheck.verify(sessions, master, NOW)
    value = await stored(sessions)
    assert value == master.check_value()
    assert value is not None and value.startswith("v1:")
    for form in key_forms(KEY_A):
        assert form not in value
    await keycheck.verify(sessions, MasterKey(KEY_A), NOW)  # another process, same key
    assert await stored(sessions) == value


async def test_another_key_is_refused_naming_the_variable_and_the_key_file(
    sessions: SessionFactory, tmp_path: Path
) -> None:
    await keycheck.verify(sessions, MasterKey(KEY_A), NOW)
    key_file = tmp_path / "data" / "vault-master.key"
    with pytest.raises(keycheck.MasterKeyMismatch) as from_file:
        await keycheck.verify(sessions, MasterKey(KEY_B, key_file), NOW)
    message = str(from_file.value)
    assert "GATEWAY_VAULT_MASTER_KEY" in message and str(key_file) in message
    assert "\n" not in message
    with pytest.raises(keycheck.MasterKeyMismatch) as from_env:
        await keycheck.verify(sessions, MasterKey(KEY_B), NOW)
    assert "from GATEWAY_VAULT_MASTER_KEY" in str(from_env.value)
    for form in key_forms(KEY_A) + key_forms(KEY_B):
        assert form not in message and form not in str(from_env.value)
    assert await stored(sessions) == MasterKey(KEY_A).check_value()  # unchanged


@pytest.mark.parametrize("rounds", [5])
async def test_two_processes_racing_with_different_keys_one_wins_the_other_refuses(
    db_url: str, rounds: int
) -> None:
    """Each `process` has an engine of its own; on a fresh row each round."""
    engines = [create_engine(db_url), create_engine(db_url)]
    try:
        factories = [session_factory(engine) for engine in engines]
        for round_ in range(rounds):
            async with factories[0]() as session:
                await session.exec(sa.text("DELETE FROM agreements"))  # type: ignore[call-overload]
                await session.commit()
            keys = [MasterKey(bytes([round_]) * 32), MasterKey(bytes([100 + round_]) * 32)]
            outcomes = await asyncio.gather(
                *(
                    keycheck.verify(factory, key, NOW)
                    for factory, key in zip(factories, keys, strict=True)
                ),
                return_exceptions=True,
            )
            refused = [o for o in outcomes if isinstance(o, keycheck.MasterKeyMismatch)]
            passed = [i for i, o in enumerate(outcomes) if o is None]
            assert len(refused) == 1 and len(passed) == 1, outcomes
            assert await stored(factories[0]) == keys[passed[0]].check_value()
    finally:
        for engine in engines:
            await engine.dispose()


async def test_a_database_from_before_the_check_takes_only_a_key_that_opens_its_data_keys(
    sessions: SessionFactory,
) -> None:
    right = MasterKey(KEY_A)
    async with sessions() as session:  # sealed by a gateway that had no check yet
        await store.data_key(session, right, "ws:old", NOW)
        await session.commit()
    with pytest.raises(keycheck.MasterKeyMismatch):
        await keycheck.verify(sessions, MasterKey(KEY_B), NOW)
    assert await stored(sessions) is None  # the wrong key planted nothing
    await keycheck.verify(sessions, right, NOW)
    assert await stored(sessions) == right.check_value()
    with pytest.raises(keycheck.MasterKeyMismatch):
        await keycheck.verify(sessions, MasterKey(KEY_B), NOW)


async def test_a_rotation_moves_the_check_value_with_the_re_wrap(
    sessions: SessionFactory,
) -> None:
    old, new = MasterKey(KEY_A), MasterKey(KEY_B)
    await keycheck.verify(sessions, old, NOW)
    async with sessions() as session:
        data_key = await store.data_key(session, old, "ws:one", NOW)
        await session.commit()
    async with sessions() as session:
        assert await store.rotate_master_key(session, old, new) == 1
        await keycheck.record(session, new, NOW)
        await session.commit()
    assert await stored(sessions) == new.check_value()
    with pytest.raises(keycheck.MasterKeyMismatch):  # the old key, at its next start
        await keycheck.verify(sessions, old, NOW)
    await keycheck.verify(sessions, new, NOW)
    async with sessions() as session:
        assert await store.data_key(session, new, "ws:one", NOW) == data_key
    # A process started before the rotation, still holding the old key, creates no data key
    # the new one could not open.
    before = await vault_key_count(sessions)
    async with sessions() as session:
        with pytest.raises(GatewayError) as refused:
            await store.data_key(session, old, "ws:two", NOW)
        assert refused.value.status == 500
    assert await vault_key_count(sessions) == before


async def test_a_rotation_rolled_back_leaves_the_check_value(sessions: SessionFactory) -> None:
    old, new = MasterKey(KEY_A), MasterKey(KEY_B)
    await keycheck.verify(sessions, old, NOW)
    async with sessions() as session:
        await store.data_key(session, old, "ws:one", NOW)
        await session.commit()
    async with sessions() as session:
        await store.rotate_master_key(session, old, new)
        await keycheck.record(session, new, NOW)
        await session.rollback()
    await keycheck.verify(sessions, old, NOW)


# --- through the CLI (in-process, SQLite) ------------------------------------------------------


@pytest.fixture
def two_hosts(tmp_path: Path, migrated_sqlite: Path) -> tuple[Path, Path, str]:
    """Host A's data dir holding the database, host B's data dir of its own on it."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    shutil.copyfile(migrated_sqlite, a / "gateway.db")
    return a, b, f"sqlite+aiosqlite:///{a / 'gateway.db'}"


def refusal(ran: Ran) -> str:
    """The one line of a refusal (stderr's only line naming the variable)."""
    lines = [line for line in ran.stderr.splitlines() if "GATEWAY_VAULT_MASTER_KEY" in line]
    assert len(lines) == 1, ran.stderr
    assert ran.returncode != 0
    return lines[0]


async def test_the_cli_refuses_another_data_dir_s_key_on_the_same_database(
    capsys: pytest.CaptureFixture[str],
    two_hosts: tuple[Path, Path, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b, url = two_hosts
    on_a = ("--data-dir", str(a))
    on_b = ("--data-dir", str(b), "--database-url", url)
    assert (await gateway(capsys, "workspaces", "create", "acme", *on_a)).returncode == 0
    first = await gateway(capsys, "workspaces", "webhook-secret", "acme", *on_a)
    assert first.returncode == 0, first.stderr
    secret = first.stdout.strip().splitlines()[-1]

    # B's own key file (generated on first use) is not the database's.
    other = await gateway(capsys, "workspaces", "webhook-secret", "acme", *on_b)
    line = refusal(other)
    assert line.startswith("gateway: error: ")
    assert str((b / "vault-master.key").absolute()) in line
    assert secret not in other.stdout + other.stderr
    key_b = (b / "vault-master.key").read_text().strip()
    assert key_b not in line

    # Nor is a key given in the environment; nor may it rotate anything.
    monkeypatch.setenv("GATEWAY_VAULT_MASTER_KEY", key_b)
    assert "from GATEWAY_VAULT_MASTER_KEY" in refusal(
        await gateway(capsys, "vault", "rotate-master-key", *on_b)
    )
    # A's key in B's environment: the same key, B works.
    monkeypatch.setenv("GATEWAY_VAULT_MASTER_KEY", (a / "vault-master.key").read_text().strip())
    shared = await gateway(capsys, "workspaces", "webhook-secret", "acme", *on_b)
    assert shared.returncode == 0, shared.stderr
    assert shared.stdout.strip().splitlines()[-1] == secret


async def test_a_cli_rotation_refuses_the_old_key_afterwards(
    capsys: pytest.CaptureFixture[str], two_hosts: tuple[Path, Path, str]
) -> None:
    a, _, _ = two_hosts
    on_a = ("--data-dir", str(a))
    assert (await gateway(capsys, "workspaces", "create", "acme", *on_a)).returncode == 0
    assert (await gateway(capsys, "workspaces", "webhook-secret", "acme", *on_a)).returncode == 0
    old_key = (a / "vault-master.key").read_text()
    rotated = await gateway(capsys, "vault", "rotate-master-key", *on_a)
    assert rotated.returncode == 0, rotated.stderr
    assert (await gateway(capsys, "workspaces", "webhook-secret", "acme", *on_a)).returncode == 0
    (a / "vault-master.key").write_text(old_key)  # a host that kept the old key
    refusal(await gateway(capsys, "workspaces", "webhook-secret", "acme", *on_a))
