"""The vault: host-bound secrets of a workspace and of its interns. Values are sealed at rest
(see crypto.py) and leave only through `release`, and only for one of their hosts."""

from __future__ import annotations

import ipaddress
import logging
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from server.db.models import Intern, VaultKey, VaultSecret, Workspace
from server.errors import GatewayError, bad_request, not_found
from server.hostnames import dns_name
from server.vault import crypto, keycheck

log = logging.getLogger("gateway.vault")

NAME = re.compile(r"(?!.*__)[a-z]([a-z0-9_]*[a-z0-9])?")
MAX_NAME = 255
MAX_VALUE = 65536
MAX_HOSTS = 100
MAX_COPY = 100
PAGE_DEFAULT = 100
PAGE_MAX = 100
WORKSPACE_SCOPE = "workspace"
_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


@dataclass(frozen=True)
class Scope:
    workspace: Workspace
    intern: Intern | None

    @property
    def name(self) -> str:
        return self.intern.id if self.intern is not None else WORKSPACE_SCOPE

    @property
    def vault_id(self) -> str:
        return f"intern:{self.intern.id}" if self.intern is not None else f"ws:{self.workspace.id}"


def check_name(name: str, param: str = "name") -> str:
    if not 1 <= len(name) <= MAX_NAME or not NAME.fullmatch(name):
        raise bad_request(
            f"{param} must be 1-{MAX_NAME} characters: lowercase letters, digits and single "
            "underscores, starting with a letter and not ending with an underscore",
            param=param,
        )
    return name


def check_value(value: str) -> str:
    if not 1 <= len(value) <= MAX_VALUE:
        raise bad_request(f"value must be 1 to {MAX_VALUE} characters", param="value")
    return value


def normalize_host(raw: str, param: str = "hosts") -> str:
    host = raw.strip().lower()
    if host.endswith("."):
        host = host[:-1]
    if not host or any(c in host for c in ":/*@?#[] \\"):
        raise bad_request(
            f"{param}: {raw!r} is not an exact DNS name (no scheme, port, path or wildcard)",
            param=param,
        )
    host = dns_name(host)  # an internationalized name in its IDNA (punycode) form
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        raise bad_request(f"{param}: {raw!r} is an IP address, not a DNS name", param=param)
    labels = host.split(".")
    if len(host) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise bad_request(f"{param}: {raw!r} is not a valid DNS name", param=param)
    return host


def check_hosts(hosts: list[str]) -> list[str]:
    if not 1 <= len(hosts) <= MAX_HOSTS:
        raise bad_request(f"hosts must list 1 to {MAX_HOSTS} DNS names", param="hosts")
    return list(dict.fromkeys(normalize_host(h) for h in hosts))


async def _data_key(
    session: AsyncSession, master: crypto.MasterKey, vault_id: str, now: datetime
) -> bytes:
    """The vault's data key, created on first use (first writer wins)."""
    row = await session.get(VaultKey, vault_id)
    if row is None:
        if not await keycheck.data_key_allowed(session, master):
            # Started before a rotation: a data key wrapped by the old key would not open.
            log.error(
                "the vault master key %s is no longer this database's: restart with the new one",
                master.source,
            )
            raise GatewayError(500, "Internal server error")
        dialect = session.get_bind().dialect.name
        insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
        await session.exec(
            insert(VaultKey.__table__)
            .values(
                vault_id=vault_id,
                wrapped_key=master.wrap(crypto.new_data_key()),
                master_key_id=master.key_id,
                created_at=now,
            )
            .on_conflict_do_nothing(index_elements=["vault_id"])
        )
        row = await session.get(VaultKey, vault_id, populate_existing=True)
        assert row is not None
    if row.master_key_id != master.key_id:
        raise GatewayError(500, "Internal server error")  # wrong master key configured
    return master.unwrap(row.wrapped_key)


async def data_key(
    session: AsyncSession, master: crypto.MasterKey, vault_id: str, now: datetime
) -> bytes:
    """A data key of its own for another sealed store (BYOK keys use "byok:<workspace>"):
    created on first use, and re-wrapped by `rotate_master_key` with the vault's."""
    return await _data_key(session, master, vault_id, now)


def record(secret: VaultSecret) -> dict[str, Any]:
    """Metadata only: never the value."""
    return {
        "name": secret.name,
        "hosts": list(secret.hosts),
        "fingerprint": secret.fingerprint,
        "created_at": secret.created_at,
        "updated_at": secret.updated_at,
    }


async def put_secret(
    session: AsyncSession,
    master: crypto.MasterKey,
    scope: Scope,
    name: str,
    value: str,
    hosts: list[str],
    now: datetime,
) -> VaultSecret:
    """Create or replace; one statement, so concurrent writers never leave a half row and
    the last committed write wins. The caller commits."""
    key = await _data_key(session, master, scope.vault_id, now)
    sealed, nonce = crypto.seal(key, scope.workspace.id, scope.name, name, value)
    table = VaultSecret.__table__
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = insert(table).values(
        id=f"sec_{secrets.token_hex(12)}",
        workspace_id=scope.workspace.id,
        scope=scope.name,
        name=name,
        ciphertext=sealed,
        nonce=nonce,
        hosts=hosts,
        fingerprint=crypto.fingerprint(key, value),
        created_at=now,
        updated_at=now,
    )
    statement = statement.on_conflict_do_update(
        index_elements=["workspace_id", "scope", "name"],
        set_={
            k: statement.excluded[k]
            for k in ("ciphertext", "nonce", "hosts", "fingerprint", "updated_at")
        },
    )
    await session.exec(statement)
    stored = await _find(session, scope.workspace.id, scope.name, name)
    assert stored is not None
    return stored


async def _find(
    session: AsyncSession, workspace_id: str, scope: str, name: str
) -> VaultSecret | None:
    return (
        await session.exec(
            select(VaultSecret)
            .where(
                VaultSecret.workspace_id == workspace_id,
                VaultSecret.scope == scope,
                VaultSecret.name == name,
            )
            .execution_options(populate_existing=True)
        )
    ).one_or_none()


async def get_secret(session: AsyncSession, scope: Scope, name: str) -> VaultSecret:
    """The secret of this scope (never the same name of another scope): metadata only is
    shown of it."""
    secret = await _find(session, scope.workspace.id, scope.name, check_name(name))
    if secret is None:
        raise not_found(f"Secret {name!r} not found")
    return secret


async def list_secrets(
    session: AsyncSession, scope: Scope, offset: int, limit: int
) -> tuple[list[VaultSecret], bool]:
    query = (
        select(VaultSecret)
        .where(VaultSecret.workspace_id == scope.workspace.id, VaultSecret.scope == scope.name)
        .order_by(col(VaultSecret.name))
        .offset(offset)
        .limit(limit + 1)
    )
    rows = list((await session.exec(query)).all())
    return rows[:limit], len(rows) > limit


async def delete_secret(session: AsyncSession, scope: Scope, name: str) -> None:
    """Deletes in this scope only: never the same name in another scope. The caller commits."""
    table = VaultSecret.__table__
    result = await session.exec(
        sa.delete(table).where(
            table.c.workspace_id == scope.workspace.id,
            table.c.scope == scope.name,
            table.c.name == name,
        )
    )
    if result.rowcount == 0:
        raise not_found(f"Secret {name!r} not found")


async def copy_to_intern(
    session: AsyncSession,
    master: crypto.MasterKey,
    workspace: Workspace,
    intern: Intern,
    names: list[str],
    now: datetime,
) -> list[VaultSecret]:
    if not 1 <= len(names) <= MAX_COPY:
        raise bad_request(f"names must list 1 to {MAX_COPY} secret names", param="names")
    if len(set(names)) != len(names):
        raise bad_request("names must be unique", param="names")
    for name in names:
        check_name(name, "names")
    source = Scope(workspace, None)
    target = Scope(workspace, intern)
    key = await _data_key(session, master, source.vault_id, now)
    copied = []
    for name in names:
        secret = await _find(session, workspace.id, WORKSPACE_SCOPE, name)
        if secret is None:
            raise not_found(f"Secret {name!r} not found in the workspace")
        value = crypto.open_sealed(
            key, workspace.id, WORKSPACE_SCOPE, name, secret.ciphertext, secret.nonce
        )
        copied.append(
            await put_secret(session, master, target, name, value, list(secret.hosts), now)
        )
    return copied


async def effective_secrets(session: AsyncSession, scope: Scope) -> list[tuple[VaultSecret, str]]:
    """The intern's secrets, and the workspace's that no intern secret of the same name
    shadows; ordered by name."""
    assert scope.intern is not None
    rows = (
        await session.exec(
            select(VaultSecret).where(
                VaultSecret.workspace_id == scope.workspace.id,
                col(VaultSecret.scope).in_((WORKSPACE_SCOPE, scope.intern.id)),
            )
        )
    ).all()
    chosen: dict[str, tuple[VaultSecret, str]] = {}
    for secret in rows:
        kind = "intern" if secret.scope != WORKSPACE_SCOPE else "workspace"
        if secret.name not in chosen or kind == "intern":
            chosen[secret.name] = (secret, kind)
    return [chosen[name] for name in sorted(chosen)]


class HostNotAllowed(Exception):
    """The secret is bound to other hosts; the value was not released."""


async def release(
    session: AsyncSession,
    master: crypto.MasterKey,
    workspace: Workspace,
    intern: Intern | None,
    name: str,
    request_host: str,
    now: datetime,
) -> str:
    """A secret's value, for a request to one of its exact hosts only (an intern's own secret
    shadows the workspace's). For features that call out on an intern's behalf."""
    scope = Scope(workspace, intern)
    secret = None
    if intern is not None:
        secret = await _find(session, workspace.id, intern.id, name)
    if secret is None:
        scope = Scope(workspace, None)
        secret = await _find(session, workspace.id, WORKSPACE_SCOPE, name)
    if secret is None:
        raise LookupError(name)
    try:
        # Exact: a port (another service) or anything but a DNS name releases nothing.
        host = normalize_host(request_host)
    except GatewayError as exc:
        raise HostNotAllowed(name) from exc
    if host not in secret.hosts:
        raise HostNotAllowed(name)
    key = await _data_key(session, master, scope.vault_id, now)
    return crypto.open_sealed(key, workspace.id, scope.name, name, secret.ciphertext, secret.nonce)


async def rotate_master_key(
    session: AsyncSession, old: crypto.MasterKey, new: crypto.MasterKey
) -> int:
    """Re-wrap every data key under the new master key; ciphertexts are not touched.
    The caller commits."""
    rows = (await session.exec(select(VaultKey))).all()
    for row in rows:
        if row.master_key_id == new.key_id:
            continue
        if row.master_key_id != old.key_id:
            raise ValueError(f"vault {row.vault_id} is wrapped by an unknown master key")
        row.wrapped_key = new.wrap(old.unwrap(row.wrapped_key))
        row.master_key_id = new.key_id
        session.add(row)
    await session.flush()
    return len(rows)
