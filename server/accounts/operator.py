"""The operator credential: the key that administers every workspace (the operator routes,
/api/v1/workspaces..., and the console's Workspaces page), as the CLI does on the host.

`gateway up` and `gateway migrate` issue it when the database has none: its SHA-256 goes to
the database (one row), the plaintext to a file of mode 0600 in the data dir, and only that
file's path is ever printed. `gateway operator-key rotate` replaces it."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlmodel import col
from sqlmodel.ext.asyncio.session import AsyncSession

from server.accounts.keys import hash_key, hashes_match
from server.db.datadir import FILE_MODE, private_dir
from server.db.engine import SessionFactory
from server.db.models import OperatorKey

OPERATOR_KEY_PREFIX = "sk-gw-op-"
OPERATOR_KEY_PATTERN = re.compile(r"^sk-gw-op-[0-9a-f]{64}$")
OPERATOR_KEY_FILE = "operator-key"
_ROW = 1  # the one row


def generate_operator_key() -> str:
    return OPERATOR_KEY_PREFIX + secrets.token_hex(32)


def operator_key_path(data_dir: Path) -> Path:
    return data_dir / OPERATOR_KEY_FILE


@dataclass(frozen=True)
class OperatorKeyFile:
    """Where the operator key is, and what this start did about it."""

    path: Path
    created: bool  # issued now (the file was written)
    present: bool  # the file exists (it may be missing when another host issued the key)


def _write_private(path: Path, text: str) -> Path:
    """`text` into a new file of mode 0600 beside `path` (renamed into place by the caller),
    readable by the operator's user only."""
    private_dir(path.parent)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    os.fchmod(descriptor, FILE_MODE)  # os.open's mode is masked by the umask
    with os.fdopen(descriptor, "w") as file:
        file.write(text + "\n")
    return temporary


async def _store(sessions: SessionFactory, data_dir: Path, now: datetime, replace: bool) -> Path:
    """A new key: its hash stored, its plaintext in the file. The file is written first and
    moved into place only once the row is committed, so a key that lost a race (two first
    starts at once) never overwrites the one that won."""
    key = generate_operator_key()
    path = operator_key_path(data_dir)
    temporary = _write_private(path, key)
    try:
        async with sessions() as session:
            values = {"key_hash": hash_key(key), "created_at": now}
            updated = 0
            if replace:
                result = await session.exec(
                    sa.update(OperatorKey).where(col(OperatorKey.id) == _ROW).values(**values)
                )
                updated = result.rowcount
            if not updated:  # an IntegrityError when another process issued it first
                await session.exec(sa.insert(OperatorKey).values(id=_ROW, **values))
            await session.commit()
        temporary.replace(path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
    return path


async def ensure_operator_key(
    sessions: SessionFactory, data_dir: Path, now: datetime
) -> OperatorKeyFile:
    """Issue the operator key when the database has none; otherwise leave it as it is."""
    path = operator_key_path(data_dir)
    async with sessions() as session:
        existing = await session.get(OperatorKey, _ROW)
    if existing is not None:
        return OperatorKeyFile(path, created=False, present=path.is_file())
    try:
        await _store(sessions, data_dir, now, replace=False)
    except IntegrityError:  # another process issued it first
        return OperatorKeyFile(path, created=False, present=path.is_file())
    return OperatorKeyFile(path, created=True, present=True)


async def rotate_operator_key(sessions: SessionFactory, data_dir: Path, now: datetime) -> Path:
    """A new operator key replacing the old one (which stops working at once)."""
    return await _store(sessions, data_dir, now, replace=True)


async def is_operator_key(session: AsyncSession, token: str) -> bool:
    if not OPERATOR_KEY_PATTERN.match(token):
        return False
    row = await session.get(OperatorKey, _ROW)
    return row is not None and hashes_match(row.key_hash, hash_key(token))
