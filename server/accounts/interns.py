"""A workspace's interns read back (GET /api/v1/interns): the console offers each one's
vault by name rather than asking for an id."""

from __future__ import annotations

from typing import Any

from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from server.clock import rfc3339
from server.db.models import Intern, Workspace


async def list_interns(session: AsyncSession, workspace: Workspace) -> list[Intern]:
    """The workspace's interns by name; none outside the intern programme."""
    if not workspace.intern_programme:
        return []
    rows = await session.exec(
        select(Intern).where(col(Intern.workspace_id) == workspace.id).order_by(col(Intern.name))
    )
    return list(rows)


def intern_document(intern: Intern) -> dict[str, Any]:
    return {"id": intern.id, "name": intern.name, "created_at": rfc3339(intern.created_at)}
