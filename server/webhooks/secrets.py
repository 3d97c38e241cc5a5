"""A workspace's webhook signing secret (Standard Webhooks' `whsec_…`): made, and created on
first use."""

from __future__ import annotations

import base64
import secrets

import sqlalchemy as sa

from server.db.engine import SessionFactory
from server.db.models import Workspace

_WORKSPACES = Workspace.__table__


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


async def workspace_secret(sessions: SessionFactory, workspace_id: str) -> str:
    """The workspace's signing secret, created on first use (race-free: first writer wins)."""
    async with sessions() as session:
        candidate = new_secret()
        await session.exec(
            sa.update(_WORKSPACES)
            .where(_WORKSPACES.c.id == workspace_id, _WORKSPACES.c.webhook_secret.is_(None))
            .values(webhook_secret=candidate)
        )
        await session.commit()
        secret = (
            await session.exec(  # type: ignore[call-overload]  # sqlmodel's exec() is typed for its own select() only
                sa.select(_WORKSPACES.c.webhook_secret).where(_WORKSPACES.c.id == workspace_id)
            )
        ).scalar_one()
        return str(secret)
