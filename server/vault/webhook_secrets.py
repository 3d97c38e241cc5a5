"""A workspace's webhook signing secret (Standard Webhooks' `whsec_…`), created on first use
and sealed at rest as vault values are: AES-256-GCM under a data key of the workspace's own
("webhook:<id>", wrapped by the vault's master key and re-wrapped with the vault's by
`gateway vault rotate-master-key`), the workspace id as associated data. The database never
holds it in clear.

Gateways before migration 0014 stored it in clear (`workspaces.webhook_secret`): each
server start (and `gateway migrate`) seals those, keeping their value, so receivers'
signatures keep verifying, and clears the column. On SQLite the rewritten pages are zeroed
(`secure_delete`) and the WAL checkpointed and truncated, so no copy of the old value is
left in the database files either."""

from __future__ import annotations

import logging
from datetime import datetime

import sqlalchemy as sa
from sqlmodel.ext.asyncio.session import AsyncSession

from server.db.engine import SessionFactory
from server.db.models import Workspace
from server.vault import crypto
from server.vault.store import data_key
from server.webhooks.secrets import new_secret

log = logging.getLogger("gateway.webhooks")

_WORKSPACES = Workspace.__table__
_SCOPE = "webhook"
_NAME = "signing-secret"


def vault_id(workspace_id: str) -> str:
    return f"webhook:{workspace_id}"


async def _seal_into(
    session: AsyncSession,
    master: crypto.MasterKey,
    workspace_id: str,
    secret: str,
    now: datetime,
) -> None:
    """Seal `secret` as the workspace's unless it already has a sealed one (first writer
    wins), clearing the legacy clear-text column in the same statement."""
    key = await data_key(session, master, vault_id(workspace_id), now)
    sealed, nonce = crypto.seal(key, workspace_id, _SCOPE, _NAME, secret)
    await session.exec(
        sa.update(_WORKSPACES)
        .where(_WORKSPACES.c.id == workspace_id, _WORKSPACES.c.webhook_secret_sealed.is_(None))
        .values(webhook_secret_sealed=sealed, webhook_secret_nonce=nonce, webhook_secret=None)
    )


async def _stored(
    session: AsyncSession, workspace_id: str
) -> tuple[bytes | None, bytes | None, str | None]:
    """The sealed secret and its nonce, and the legacy clear-text column."""
    columns = (
        _WORKSPACES.c.webhook_secret_sealed,
        _WORKSPACES.c.webhook_secret_nonce,
        _WORKSPACES.c.webhook_secret,
    )
    row = (
        await session.exec(  # type: ignore[call-overload]  # sqlmodel's exec() is typed for its own select() only
            sa.select(*columns).where(_WORKSPACES.c.id == workspace_id)
        )
    ).one()
    return row[0], row[1], row[2]


async def workspace_secret(
    sessions: SessionFactory, master: crypto.MasterKey, workspace_id: str, now: datetime
) -> str:
    """The workspace's signing secret, created (sealed) on first use; race-free."""
    async with sessions() as session:
        sealed, nonce, legacy = await _stored(session, workspace_id)
    if sealed is None:
        if legacy is not None:  # left by an older gateway: kept, sealed
            await seal_legacy_secrets(sessions, master, now)
        else:
            async with sessions() as session:
                await _seal_into(session, master, workspace_id, new_secret(), now)
                await session.commit()
    async with sessions() as session:
        if sealed is None:
            sealed, nonce, _ = await _stored(session, workspace_id)
        key = await data_key(session, master, vault_id(workspace_id), now)
    if sealed is None or nonce is None:  # the statements above leave one sealed
        raise RuntimeError(f"workspace {workspace_id} has no sealed webhook secret")
    return crypto.open_sealed(key, workspace_id, _SCOPE, _NAME, sealed, nonce)


async def _legacy(sessions: SessionFactory) -> list[tuple[str, str]]:
    async with sessions() as session:
        rows = (
            await session.exec(  # type: ignore[call-overload]  # as above
                sa.select(_WORKSPACES.c.id, _WORKSPACES.c.webhook_secret).where(
                    _WORKSPACES.c.webhook_secret.is_not(None)
                )
            )
        ).all()
    return [(str(workspace_id), str(secret)) for workspace_id, secret in rows]


async def legacy_secrets(sessions: SessionFactory) -> int:
    """How many signing secrets an older gateway left in clear (sealing them needs the
    master key: load it only when there are some)."""
    return len(await _legacy(sessions))


async def seal_legacy_secrets(
    sessions: SessionFactory, master: crypto.MasterKey, now: datetime
) -> int:
    """Seal every signing secret an older gateway stored in clear, keeping its value, and
    clear the column; how many were sealed. Nothing to do (every start but one) is one
    query."""
    found = await _legacy(sessions)
    if not found:
        return 0
    async with sessions() as session:
        sqlite = session.get_bind().dialect.name == "sqlite"
        if sqlite:
            # The rows' old cells and freed pages overwritten with zeros, not left behind.
            await (await session.connection()).exec_driver_sql("PRAGMA secure_delete=ON")
        try:
            for workspace_id, secret in found:
                await _seal_into(session, master, workspace_id, secret, now)
            # A workspace sealed meanwhile (another process) keeps its secret: clear the rest.
            await session.exec(
                sa.update(_WORKSPACES)
                .where(_WORKSPACES.c.webhook_secret_sealed.is_not(None))
                .where(_WORKSPACES.c.webhook_secret.is_not(None))
                .values(webhook_secret=None)
            )
            await session.commit()
        finally:
            if sqlite:
                connection = await session.connection()
                await connection.exec_driver_sql("PRAGMA secure_delete=OFF")
                # The pages that held them, copied back from the WAL, and the WAL emptied.
                await connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    log.warning("sealed %d webhook signing secrets stored in clear by an older gateway", len(found))
    return len(found)
