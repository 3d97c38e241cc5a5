"""The credit ledger: purchases and charges, each written with its counters in one transaction."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlmodel import col
from sqlmodel.ext.asyncio.session import AsyncSession

from server.billing.money import MAX_MICROS, AmountError
from server.billing.usage import ACCOUNT, KEY, upsert_statement, usage_params
from server.db.driver import fetch_rows, insert_statement
from server.db.models import Account, LedgerEntry

# A charge's two statements (server/billing/holds.py runs them as one on PostgreSQL). The
# ledger row's columns are bound as entry_<column>: a statement that also updates a hold
# must not bind a parameter named after one of its columns (account_id, created_at, ...),
# which SQLAlchemy's own execution would add to the UPDATE's SET.
INSERT_ENTRY = insert_statement(LedgerEntry.__table__, generated=("id",), prefix="entry_")
COUNTERS = upsert_statement(2)  # the key's and the account's

PURCHASE = "purchase"
CHARGE = "charge"


async def add_credits(
    session: AsyncSession,
    account_id: str,
    amount_micros: int,
    now: datetime,
    reference: str | None = None,
) -> LedgerEntry:
    """Record a credit purchase. The caller commits. The account's purchases stay within
    MAX_MICROS (1e9 USD) in total (AmountError otherwise), so balances fit int64 and print
    exactly as JSON numbers."""
    if amount_micros <= 0:
        raise ValueError("a purchase must be a positive amount")
    if amount_micros > MAX_MICROS:
        raise AmountError("must be at most 1000000000 USD (1e9)")
    result = await session.exec(
        sa.update(Account)
        .where(
            col(Account.id) == account_id,
            col(Account.credits_purchased_micros) <= MAX_MICROS - amount_micros,
        )
        .values(credits_purchased_micros=Account.credits_purchased_micros + amount_micros)
    )
    if result.rowcount != 1:
        find = sa.select(col(Account.id)).where(col(Account.id) == account_id)
        exists = (await session.exec(find)).first()  # type: ignore[call-overload]  # sqlmodel's exec() is typed for its own select() only
        if exists is None:
            raise LookupError(f"no account {account_id}")
        raise AmountError("would take the account's credits beyond 1000000000 USD (1e9)")
    entry = LedgerEntry(
        account_id=account_id,
        kind=PURCHASE,
        amount_micros=amount_micros,
        reference=reference,
        created_at=now,
    )
    session.add(entry)
    await session.flush()
    return entry


def charge_params(
    *,
    account_id: str,
    key_hash: str,
    amount_micros: int,
    is_byok: bool,
    now: datetime,
    reference: str | None = None,
) -> dict[str, object]:
    """The parameters of a charge's two statements, INSERT_ENTRY and COUNTERS (one mapping:
    each reads its own names): its ledger row, and what its key's and account's counters
    gain. BYOK usage is counted in the byok counters only: the provider bills the workspace
    directly."""
    if amount_micros < 0:
        raise ValueError("a charge cannot be negative")
    spend, byok = (0, amount_micros) if is_byok else (amount_micros, 0)
    params = usage_params([(KEY, key_hash), (ACCOUNT, account_id)], now, spend, byok)
    # The row's values as a plain mapping, on the driver connection rather than an ORM
    # object and flush: this runs on every billable request, and the ORM object would cost
    # more than the statement.
    params["entry_account_id"] = account_id
    params["entry_key_hash"] = key_hash
    params["entry_kind"] = CHARGE
    params["entry_amount_micros"] = amount_micros
    params["entry_is_byok"] = is_byok
    params["entry_reference"] = reference
    params["entry_created_at"] = now
    return params


async def record_charge(session: AsyncSession, params: dict[str, object]) -> None:
    """Record what a request cost, on the ledger and the key's and account's counters:
    `params` from `charge_params`. The caller commits."""
    await fetch_rows(session, INSERT_ENTRY, params)
    await fetch_rows(session, COUNTERS, params)
