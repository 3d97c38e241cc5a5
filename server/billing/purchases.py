"""An account's credit purchases read back from the ledger (GET /api/v1/credits/purchases),
newest first, paged."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession
from sqlmodel.sql.expression import SelectOfScalar

from server.billing.ledger import PURCHASE
from server.billing.money import micros_to_json_number
from server.clock import rfc3339
from server.db.models import LedgerEntry


def _of_account(account_id: str) -> tuple[sa.ColumnElement[bool], ...]:
    # What ix_ledger_entries_account_kind_created seeks (migration 0018).
    return (col(LedgerEntry.account_id) == account_id, col(LedgerEntry.kind) == PURCHASE)


def purchases_page(account_id: str, offset: int, limit: int) -> SelectOfScalar[LedgerEntry]:
    """The statement of one page of the account's purchases, newest first."""
    return (
        select(LedgerEntry)
        .where(*_of_account(account_id))
        .order_by(col(LedgerEntry.created_at).desc(), col(LedgerEntry.id).desc())
        .offset(offset)
        .limit(limit)
    )


async def list_purchases(
    session: AsyncSession, account_id: str, offset: int, limit: int
) -> tuple[list[LedgerEntry], int]:
    total = (
        await session.exec(
            select(sa.func.count()).select_from(LedgerEntry).where(*_of_account(account_id))
        )
    ).one()
    rows = await session.exec(purchases_page(account_id, offset, limit))
    return list(rows), int(total)


def purchase_document(entry: LedgerEntry) -> dict[str, Any]:
    return {
        "id": str(entry.id),
        "amount": micros_to_json_number(entry.amount_micros),
        "created_at": rfc3339(entry.created_at),
    }
