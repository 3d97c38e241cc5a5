"""Credit holds: reserve a request's estimated cost up front, settle it to the real cost when
the request finishes, release it on failure. Holds and settlements of one account are
serialized by an UPDATE of the account row, so parallel requests — on one process or many —
never spend beyond the balance or a key's cap."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlmodel.ext.asyncio.session import AsyncSession

from server.billing.key_status import limit_remaining
from server.billing.ledger import record_charge
from server.billing.usage import ACCOUNT, KEY, read_usages
from server.db.models import Account, ApiKey, CreditHold
from server.errors import GatewayError

DEFAULT_HOLD_TTL = timedelta(minutes=15)
# How long a client is told to wait when only running requests' holds are in the way.
IN_FLIGHT_RETRY_SECONDS = 1


@dataclass(frozen=True)
class Hold:
    id: str
    account_id: str
    key_hash: str
    amount_micros: int
    is_byok: bool


def insufficient(source: str, message: str, retry_after: int | None = None) -> GatewayError:
    return GatewayError(402, message, {"limit_source": source}, retry_after_seconds=retry_after)


async def _lock_account(session: AsyncSession, account_id: str) -> None:
    await session.exec(
        sa.update(Account)
        .where(Account.id == account_id)  # type: ignore[arg-type]
        .values(lock_version=Account.lock_version + 1)
    )


async def _held(session: AsyncSession, column: sa.ColumnElement[bool], now: datetime) -> int:
    total = (
        await session.exec(
            sa.select(sa.func.coalesce(sa.func.sum(CreditHold.amount_micros), 0)).where(
                column,
                CreditHold.expires_at > now,  # type: ignore[operator]
            )
        )
    ).one()[0]
    return int(total)


async def place_hold(
    session: AsyncSession,
    *,
    account_id: str,
    key_hash: str,
    amount_micros: int,
    now: datetime,
    is_byok: bool = False,
    ttl: timedelta = DEFAULT_HOLD_TTL,
) -> Hold:
    """Reserve `amount_micros` or fail with 402 (`metadata.limit_source`). Commits."""
    if amount_micros < 0:
        raise ValueError("a hold cannot be negative")
    await _lock_account(session, account_id)
    account = await session.get(Account, account_id, populate_existing=True)
    key = await session.get(ApiKey, key_hash, populate_existing=True)
    if account is None or key is None:
        raise GatewayError(401, "Invalid API key")
    await session.exec(
        sa.delete(CreditHold).where(
            CreditHold.account_id == account_id,  # type: ignore[arg-type]
            CreditHold.expires_at <= now,  # type: ignore[arg-type]
        )
    )
    usages = await read_usages(session, [(KEY, key_hash), (ACCOUNT, account_id)], now)
    balance = account.credits_purchased_micros - usages[(ACCOUNT, account_id)].spend["all"]
    # A balance at or below zero refuses every request, free models included.
    if balance <= 0:
        raise insufficient("credits", "Insufficient credits: add credits to continue")
    if not is_byok:
        held = await _held(
            session,
            sa.and_(
                CreditHold.account_id == account_id,  # type: ignore[arg-type]
                CreditHold.counts_against_balance.is_(True),  # type: ignore[attr-defined]
            ),
            now,
        )
        if amount_micros > balance:
            raise insufficient("credits", "Insufficient credits for this request")
        if amount_micros > balance - held:
            raise insufficient(
                "in_flight_budget",
                "Credits are held by requests still running; retry shortly",
                IN_FLIGHT_RETRY_SECONDS,
            )
    counts_against_key = not is_byok or key.include_byok_in_limit
    remaining = limit_remaining(key, usages[(KEY, key_hash)])
    if counts_against_key and remaining is not None:
        held_on_key = await _held(
            session,
            sa.and_(
                CreditHold.key_hash == key_hash,  # type: ignore[arg-type]
                CreditHold.counts_against_key_limit.is_(True),  # type: ignore[attr-defined]
            ),
            now,
        )
        if amount_micros > remaining:
            raise insufficient("key_limit", "This request exceeds the API key's credit limit")
        if amount_micros > remaining - held_on_key:
            raise insufficient(
                "in_flight_budget",
                "The key's limit is held by requests still running; retry shortly",
                IN_FLIGHT_RETRY_SECONDS,
            )
    hold = CreditHold(
        id=f"hold_{secrets.token_hex(12)}",
        account_id=account_id,
        key_hash=key_hash,
        amount_micros=amount_micros,
        counts_against_balance=not is_byok,
        counts_against_key_limit=counts_against_key,
        created_at=now,
        expires_at=now + ttl,
    )
    session.add(hold)
    await session.commit()
    return Hold(hold.id, account_id, key_hash, amount_micros, is_byok)


async def settle_hold(
    session: AsyncSession, hold: Hold, *, cost_micros: int, now: datetime, reference: str
) -> None:
    """Replace the hold by the real charge, in one transaction. Commits."""
    await _lock_account(session, hold.account_id)
    await session.exec(sa.delete(CreditHold).where(CreditHold.id == hold.id))  # type: ignore[arg-type]
    await record_charge(
        session,
        account_id=hold.account_id,
        key_hash=hold.key_hash,
        amount_micros=cost_micros,
        is_byok=hold.is_byok,
        now=now,
        reference=reference,
    )
    await session.commit()


async def release_hold(session: AsyncSession, hold: Hold) -> None:
    """Give the reservation back (the request failed). Commits."""
    await session.exec(sa.delete(CreditHold).where(CreditHold.id == hold.id))  # type: ignore[arg-type]
    await session.commit()
