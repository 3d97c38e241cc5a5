"""One vault master key per database.

Every process on a database (the server processes of each host's `gateway up`, `gateway
serve` replicas, the CLI commands that seal or open with the master key) must hold the same
master key: the data keys in `vault_keys` are wrapped by it. Each holds the one its own
environment (GATEWAY_VAULT_MASTER_KEY) or data dir (`vault-master.key`) gives it, so the
database keeps the key's check value (`MasterKey.check_value`: never the key) in
`agreements`, and every process compares its own with it before serving or writing:

- none stored yet: the first process stores its own (insert-if-absent, then read back, so
  of two racing with different keys one wins and the other refuses). On a database from
  before the check that already holds wrapped data keys, only a key that unwraps one of
  them may store it: a wrong key never becomes the reference;
- stored: equal, or the process refuses (`MasterKeyMismatch`, one line naming
  GATEWAY_VAULT_MASTER_KEY and the key file it used, never the key);
- `gateway vault rotate-master-key` re-wraps the data keys and stores the new key's value in
  the same transaction (`record`): a process still holding the old key refuses at its next
  start; one already running keeps serving, but cannot open the re-wrapped data keys (its
  vault, BYOK and webhook-signing calls fail) nor create a data key under the old key
  (`data_key_allowed`): restart it with the new key.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel.ext.asyncio.session import AsyncSession

from server.db.engine import SessionFactory
from server.db.models import Agreement, VaultKey
from server.vault.crypto import MASTER_KEY_ENV, MasterKey

NAME = "vault-master-key"

_AGREEMENTS = Agreement.__table__
_VAULT_KEYS = VaultKey.__table__


class MasterKeyMismatch(RuntimeError):
    """This process's vault master key is not the database's: it must not start."""

    def __init__(self, master: MasterKey) -> None:
        super().__init__(
            f"the vault master key {master.source} is not the one this database's vault "
            f"is sealed with: give every gateway on this database the same key "
            f"({MASTER_KEY_ENV}, or the same key file)"
        )


async def stored_check(session: AsyncSession) -> str | None:
    row = (
        await session.exec(  # type: ignore[call-overload]  # sqlmodel's exec() is typed for its own select() only
            sa.select(_AGREEMENTS.c.value).where(_AGREEMENTS.c.name == NAME)
        )
    ).first()
    return None if row is None else str(row[0])


def _store(session: AsyncSession, value: str, now: datetime, *, replace: bool) -> sa.Insert:
    """Insert the check value: if absent, or replacing the one stored (`replace`)."""
    values = {"name": NAME, "value": value, "updated_at": now}
    update = {"value": value, "updated_at": now}
    if session.get_bind().dialect.name == "postgresql":
        pg = postgresql.insert(_AGREEMENTS).values(values)
        if replace:
            return pg.on_conflict_do_update(index_elements=["name"], set_=update)
        return pg.on_conflict_do_nothing(index_elements=["name"])
    lite = sqlite.insert(_AGREEMENTS).values(values)
    if replace:
        return lite.on_conflict_do_update(index_elements=["name"], set_=update)
    return lite.on_conflict_do_nothing(index_elements=["name"])


async def verify(sessions: SessionFactory, master: MasterKey, now: datetime) -> None:
    """Raise MasterKeyMismatch unless `master` is the database's master key, storing its
    check value when the database has none yet (see the module docstring)."""
    expected = master.check_value()
    async with sessions() as session:
        stored = await stored_check(session)
        if stored is None:
            # A database from before the check: its data keys say which key is right.
            wrapped = (
                await session.exec(  # type: ignore[call-overload]  # as above
                    sa.select(_VAULT_KEYS.c.wrapped_key).limit(1)
                )
            ).first()
            if wrapped is not None and not master.opens(bytes(wrapped[0])):
                raise MasterKeyMismatch(master)
            await session.exec(_store(session, expected, now, replace=False))
            await session.commit()
            stored = await stored_check(session)  # ours, or a racing process's
    if stored != expected:
        raise MasterKeyMismatch(master)


async def record(session: AsyncSession, master: MasterKey, now: datetime) -> None:
    """Store `master`'s check value as the database's (a rotation, in its transaction; the
    caller commits)."""
    await session.exec(_store(session, master.check_value(), now, replace=True))


async def data_key_allowed(session: AsyncSession, master: MasterKey) -> bool:
    """Whether a new data key may be wrapped by `master`: it is still the database's key
    (a process started before a rotation must not create data keys under the old one)."""
    stored = await stored_check(session)
    return stored is None or stored == master.check_value()
