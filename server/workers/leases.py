"""Claiming one due row with a lease: how several processes share the job queue and the
webhook outbox without doing any item twice."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlmodel.ext.asyncio.session import AsyncSession

from server.db.models import TableModel

RowT = TypeVar("RowT", bound=TableModel)


async def claim_one(
    session: AsyncSession,
    model: type[RowT],
    *,
    ready: sa.ColumnElement[bool],
    due_column: str,
    owner: str,
    now: datetime,
    lease: timedelta,
    extra_values: dict[str, Any] | None = None,
) -> RowT | None:
    """The oldest due, unleased row that is `ready`, leased to `owner`; None when there is
    none or another process won it. On PostgreSQL rows being claimed elsewhere are skipped
    (`FOR UPDATE SKIP LOCKED`); everywhere the conditional UPDATE decides who owns it."""
    table = model.__table__
    free = sa.or_(table.c.lease_expires_at.is_(None), table.c.lease_expires_at < now)
    due = (
        sa.select(table.c.id)
        .where(ready, table.c[due_column] <= now, free)
        .order_by(table.c[due_column])
        .limit(1)
    )
    if session.get_bind().dialect.name == "postgresql":
        due = due.with_for_update(skip_locked=True)
    row_id = (await session.exec(due)).scalar_one_or_none()  # type: ignore[call-overload]  # sqlmodel's exec() is typed for its own select() only
    if row_id is None:
        await session.rollback()
        return None
    claimed = await session.exec(
        sa.update(table)
        .where(table.c.id == row_id, ready, free)
        .values(lease_owner=owner, lease_expires_at=now + lease, **(extra_values or {}))
    )
    await session.commit()
    if claimed.rowcount != 1:
        return None
    return await session.get(model, row_id, populate_existing=True)
