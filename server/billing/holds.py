"""Credit holds: reserve a request's estimated cost up front, settle it to the real cost when
the request finishes, release it on failure. Holds of one account are serialized (an UPDATE
of the account row on PostgreSQL, the database's write lock on SQLite), and each reads the
whole budget in the statement that reserves, so parallel requests — on one process or many —
never spend beyond the balance or a key's cap."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlmodel.ext.asyncio.session import AsyncSession

from server.billing import ledger
from server.billing.periods import EPOCH, PERIODS, period_starts
from server.billing.usage import ACCOUNT, KEY
from server.db.driver import LOCKED_IN_BATCH, execute_many, fetch_rows, insert_statement
from server.db.models import Account, ApiKey, CreditHold, UsageCounter, UtcDateTime
from server.db.writer import wait_uncancelled
from server.errors import GatewayError

DEFAULT_HOLD_TTL = timedelta(minutes=15)
# The longest a settlement or release may take once begun; it is not cut short by the
# request's cancellation (a deadline, a client that went away), only by this bound.
FINISH_TIMEOUT_SECONDS = 30.0
# How long a client is told to wait when only running requests' holds are in the way.
IN_FLIGHT_RETRY_SECONDS = 1

# The 402's `metadata.limit_source`, named as OpenRouter names them (all the sources are
# listed in server/limits/sources.py).
CREDITS = "openrouter_credits"  # the account's balance
KEY_LIMIT = "openrouter_key_limit"  # the key's own credit limit
IN_FLIGHT_BUDGET = "openrouter_in_flight_budget"  # held by requests still running


@dataclass(frozen=True)
class Hold:
    id: str  # its own credit_holds row; "" when it has none (unreserved, or leased)
    account_id: str
    key_hash: str
    amount_micros: int
    is_byok: bool
    # Admitted against this process's lease of the budget (server/limits/leases.py): the
    # lease's row holds the amount, and `ref` tells this admission from the lease's others.
    lease_id: str = ""
    ref: int = 0

    @classmethod
    def unreserved(cls, account_id: str, key_hash: str) -> Hold:
        """A zero-cost request's: nothing stored, so settling it only records the charge and
        releasing it changes nothing."""
        return cls("", account_id, key_hash, 0, False)


def insufficient(source: str, message: str, retry_after: int | None = None) -> GatewayError:
    return GatewayError(402, message, {"limit_source": source}, retry_after_seconds=retry_after)


_HOLDS = CreditHold.__table__
_COUNTERS = UsageCounter.__table__
_ACCOUNTS = Account.__table__
_KEYS = ApiKey.__table__

# Serializes the holds of one account. PostgreSQL: a row lock that conflicts only with itself
# (not with the key-share locks of foreign keys) and writes no new row version. SQLite has no
# row locks: a write takes the database's write lock, which a transaction keeps to its end.
_LOCK_ACCOUNT = {
    "postgresql": sa.select(_ACCOUNTS.c.id)
    .where(_ACCOUNTS.c.id == sa.bindparam("account_id"))
    .with_for_update(key_share=True),
    "sqlite": sa.update(_ACCOUNTS)
    .where(_ACCOUNTS.c.id == sa.bindparam("account_id"))
    .values(lock_version=_ACCOUNTS.c.lock_version + 1),
}


async def lock_account(session: AsyncSession, account_id: str) -> None:
    """Serialize the account's holds until the caller's transaction ends. In a group-commit
    batch, once per account: the batch's transaction keeps the lock to its commit."""
    locked = session.info.get(LOCKED_IN_BATCH)
    if locked is not None and account_id in locked:
        return
    await fetch_rows(session, _LOCK_ACCOUNT, {"account_id": account_id})
    if locked is not None:
        locked.add(account_id)


def _held_sum(*conditions: sa.ColumnElement[bool]) -> sa.ScalarSelect[int]:
    return (
        sa.select(sa.func.coalesce(sa.func.sum(_HOLDS.c.amount_micros), 0))
        .where(*conditions, _HOLDS.c.expires_at > sa.bindparam("now", type_=UtcDateTime))
        .scalar_subquery()
    )


def _key_period(limit_reset: sa.ColumnElement[str], starts: bool) -> sa.ColumnElement[object]:
    """The usage period (or its start) a key's cap is measured over, from its limit_reset."""
    names = ("day", "week", "month", "all")
    values = (
        [sa.bindparam(f"{n}_start", type_=sa.Date) for n in names]
        if starts
        else [sa.literal(n) for n in names]
    )
    return sa.case(
        (limit_reset == "daily", values[0]),
        (limit_reset == "weekly", values[1]),
        (limit_reset == "monthly", values[2]),
        else_=values[3],
    )


def funded(account_id: str = "account_id") -> sa.Exists:
    """Whether the account (bound as :`account_id`) has a positive balance: all that a request
    reserving nothing (a zero estimate: a `:free` model) needs. A balance at or below zero
    refuses every request. It takes no lock: such a request cannot spend what others hold."""
    spent = (
        sa.select(_COUNTERS.c.spend_micros)
        .where(
            _COUNTERS.c.subject == ACCOUNT,
            _COUNTERS.c.subject_id == sa.bindparam(account_id),
            _COUNTERS.c.period == "all",
            _COUNTERS.c.period_start == EPOCH,
        )
        .scalar_subquery()
    )
    return sa.exists().where(
        _ACCOUNTS.c.id == sa.bindparam(account_id),
        _ACCOUNTS.c.credits_purchased_micros - sa.func.coalesce(spent, 0) > 0,
    )


def unfunded() -> GatewayError:
    return insufficient(CREDITS, "Insufficient credits: add credits to continue")


# Everything a hold decision needs, read in ONE statement, so it sees one snapshot: a
# settlement (hold deleted + charge added, in one transaction) is seen whole or not at all.
# Compiled once.
_BUDGET = (
    sa.select(
        _ACCOUNTS.c.credits_purchased_micros.label("purchased"),
        sa.func.coalesce(
            sa.select(_COUNTERS.c.spend_micros)
            .where(
                _COUNTERS.c.subject == ACCOUNT,
                _COUNTERS.c.subject_id == sa.bindparam("account_id"),
                _COUNTERS.c.period == "all",
                _COUNTERS.c.period_start == sa.bindparam("all_start", type_=sa.Date),
            )
            .scalar_subquery(),
            0,
        ).label("spent"),
        _held_sum(
            _HOLDS.c.account_id == sa.bindparam("account_id"),
            _HOLDS.c.counts_against_balance.is_(True),
        ).label("held"),
        _held_sum(
            _HOLDS.c.key_hash == sa.bindparam("key_hash"),
            _HOLDS.c.counts_against_key_limit.is_(True),
        ).label("held_on_key"),
        _KEYS.c.limit_micros.label("limit"),
        _KEYS.c.include_byok_in_limit.label("byok_in_limit"),
        sa.func.coalesce(
            sa.select(
                _COUNTERS.c.spend_micros
                + sa.case((_KEYS.c.include_byok_in_limit, _COUNTERS.c.byok_micros), else_=0)
            )
            .where(
                _COUNTERS.c.subject == KEY,
                _COUNTERS.c.subject_id == sa.bindparam("key_hash"),
                _COUNTERS.c.period == _key_period(_KEYS.c.limit_reset, starts=False),
                _COUNTERS.c.period_start == _key_period(_KEYS.c.limit_reset, starts=True),
            )
            .scalar_subquery(),
            0,
        ).label("key_used"),
    )
    .select_from(
        # One account row and one key row: the join condition is the WHERE clause.
        _ACCOUNTS.join(_KEYS, sa.true())
    )
    .where(
        _ACCOUNTS.c.id == sa.bindparam("account_id"),
        _KEYS.c.hash == sa.bindparam("key_hash"),
    )
)

_INSERT_HOLD = insert_statement(_HOLDS)


def _reserve_statement(headroom: int = 1) -> sa.Insert:
    """INSERT a (non-BYOK) hold only if the budget allows it, in one statement that reads the
    budget (after the account lock, so with every settled charge and running hold) and
    writes: the rules of `refusal`, which explains a refusal. RETURNING the id if reserved.
    With `headroom` n > 1 (a lease's slice), only if the budget could take the amount n
    times: slices are taken far from a cap, so near it every request holds for itself."""
    b = _BUDGET.subquery("budget")
    amount = sa.bindparam("amount_micros", type_=sa.BigInteger)
    needed = amount if headroom == 1 else amount * headroom
    balance = b.c.purchased - b.c.spent
    key_left = sa.case((b.c.limit - b.c.key_used < 0, 0), else_=b.c.limit - b.c.key_used)
    allowed = sa.and_(
        balance > 0,  # a balance at or below zero refuses every request
        needed <= balance - b.c.held,
        sa.or_(b.c.limit.is_(None), needed <= key_left - b.c.held_on_key),
    )
    values: sa.Select = sa.select(
        sa.bindparam("id"),
        sa.bindparam("account_id"),
        sa.bindparam("key_hash"),
        amount,
        sa.true(),  # counts against the balance...
        sa.true(),  # ...and the key's cap: not BYOK
        sa.bindparam("created_at", type_=UtcDateTime),
        sa.bindparam("expires_at", type_=UtcDateTime),
    ).where(allowed)
    columns = [
        "id",
        "account_id",
        "key_hash",
        "amount_micros",
        "counts_against_balance",
        "counts_against_key_limit",
        "created_at",
        "expires_at",
    ]
    return sa.insert(_HOLDS).from_select(columns, values).returning(_HOLDS.c.id)


_RESERVE = _reserve_statement()
# How many times a lease's slice must fit in what is left of the budget (leases.py).
SLICE_HEADROOM = 4
_RESERVE_SLICE = _reserve_statement(SLICE_HEADROOM)
_DELETE_HOLD = sa.delete(_HOLDS).where(_HOLDS.c.id == sa.bindparam("hold_id"))
# A leased request settled: the lease's row gives up what the request held, in the
# transaction that records its charge (so the budget never counts it twice, nor not at all).
_SHRINK_LEASE = (
    sa.update(_HOLDS)
    .where(_HOLDS.c.id == sa.bindparam("lease_id"))
    .values(amount_micros=_HOLDS.c.amount_micros - sa.bindparam("amount", type_=sa.BigInteger))
)
_DELETE_EXPIRED = sa.delete(_HOLDS).where(_HOLDS.c.expires_at <= sa.bindparam("now"))


def _budget_params(now: datetime) -> dict[str, object]:
    """The usage periods' starts the budget statements read the counters of."""
    starts = period_starts(now)
    return {f"{period}_start": starts.of(period) for period in PERIODS}


def _hold_values(
    hold_id: str,
    account_id: str,
    key_hash: str,
    amount_micros: int,
    now: datetime,
    ttl: timedelta,
) -> dict[str, object]:
    """A hold row's values, and `now` (holds expired by then do not count)."""
    return {
        "id": hold_id,
        "account_id": account_id,
        "key_hash": key_hash,
        "amount_micros": amount_micros,
        "created_at": now,
        "expires_at": now + ttl,
        "now": now,
    }


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
    """Reserve `amount_micros` or fail with 402 (`metadata.limit_source`). The caller commits
    (with whatever else belongs to accepting the request), which also releases the account
    lock taken here: commit promptly."""
    if amount_micros < 0:
        raise ValueError("a hold cannot be negative")
    # PostgreSQL: the account row lock orders holds, and the reserve below then reads with a
    # snapshot taken after it. SQLite's reserve needs no lock: a writing statement takes the
    # database's write lock before it reads, and keeps it to the commit.
    on_sqlite = session.get_bind().dialect.name == "sqlite"
    if not on_sqlite:
        await lock_account(session, account_id)
    hold = Hold(f"hold_{secrets.token_hex(12)}", account_id, key_hash, amount_micros, is_byok)
    values = _hold_values(hold.id, account_id, key_hash, amount_micros, now, ttl)
    params = _budget_params(now)
    if not is_byok:  # the common case: check and reserve in one statement
        reserved = await fetch_rows(session, _RESERVE, {**params, **values})
        if reserved:
            return hold
    # Refused (read the budget to say why), or BYOK (whose key decides whether it counts):
    # a read, then a write, so SQLite too takes the write lock first.
    if on_sqlite:
        await lock_account(session, account_id)
    rows = await fetch_rows(
        session,
        _BUDGET,
        {"account_id": account_id, "key_hash": key_hash, "now": now, **params},
    )
    if not rows:
        raise GatewayError(401, "Invalid API key")
    row = rows[0]
    refused = refusal(row, amount_micros, is_byok)
    if refused is not None:
        raise refused
    await fetch_rows(
        session,
        _INSERT_HOLD,
        {
            **values,
            "counts_against_balance": not is_byok,
            "counts_against_key_limit": not is_byok or bool(row[5]),  # byok_in_limit
        },
    )
    return hold


def refusal(row: Sequence[Any], amount_micros: int, is_byok: bool) -> GatewayError | None:
    """Why the budget `row` cannot take `amount_micros`, or None when it can."""
    purchased, spent, held, held_on_key, limit, byok_in_limit, key_used = row
    balance = purchased - spent
    # A balance at or below zero refuses every request, free models included.
    if balance <= 0:
        return unfunded()
    if not is_byok:
        if amount_micros > balance:
            return insufficient(CREDITS, "Insufficient credits for this request")
        if amount_micros > balance - held:
            return insufficient(
                IN_FLIGHT_BUDGET,
                "Credits are held by requests still running; retry shortly",
                IN_FLIGHT_RETRY_SECONDS,
            )
    counts_against_key = not is_byok or byok_in_limit
    if counts_against_key and limit is not None:
        remaining = max(0, limit - key_used)
        if amount_micros > remaining:
            return insufficient(KEY_LIMIT, "This request exceeds the API key's credit limit")
        if amount_micros > remaining - held_on_key:
            return insufficient(
                IN_FLIGHT_BUDGET,
                "The key's limit is held by requests still running; retry shortly",
                IN_FLIGHT_RETRY_SECONDS,
            )
    return None


async def reserve_slice(
    session: AsyncSession,
    *,
    lease_id: str,
    account_id: str,
    key_hash: str,
    amount_micros: int,
    now: datetime,
    ttl: timedelta,
) -> bool:
    """Hold `amount_micros` as a lease's row (server/limits/leases.py) if the budget could
    take it SLICE_HEADROOM times over; False (nothing written) otherwise. The caller commits."""
    if amount_micros <= 0:
        raise ValueError("a slice must be positive")
    if session.get_bind().dialect.name != "sqlite":
        await lock_account(session, account_id)
    values = _hold_values(lease_id, account_id, key_hash, amount_micros, now, ttl)
    return bool(await fetch_rows(session, _RESERVE_SLICE, {**_budget_params(now), **values}))


async def sweep_expired_holds(session: AsyncSession, now: datetime) -> int:
    """Delete holds whose request died with its process (they already stopped counting)."""
    result = await session.exec(_DELETE_EXPIRED, params={"now": now})
    await session.commit()
    return int(result.rowcount or 0)


# The bind-parameter prefix of `settle_hold`'s `row` columns in the one-statement settlement.
ROW_PREFIX = "row_"
# Per table: `settle_hold`'s `row` INSERT (SQLite), and the one-statement settlements
# (PostgreSQL) by how the hold is given back and the row's table. Constants, compiled once.
_ROW_INSERTS: dict[sa.Table, sa.Insert] = {}
_SETTLEMENTS: dict[tuple[str, sa.Table | None], sa.Insert] = {}


def _settlement(hold_change: str, table: sa.Table | None) -> sa.Insert:
    """PostgreSQL: a settlement in one statement (one round trip instead of four): the
    counters' upsert, with the hold's change, the ledger row and `table`'s row as
    data-modifying CTEs, each run once to its end whatever the upsert reads. The counters
    are locked in the upsert's order, as by `record_charge`; the other rows are the
    request's own (its hold, its process's lease) or new."""
    key = (hold_change, table)
    known = _SETTLEMENTS.get(key)
    if known is not None:
        return known
    ctes = []
    if hold_change == "lease":
        ctes.append(_SHRINK_LEASE.cte("settled_hold"))
    elif hold_change == "drop":
        ctes.append(_DELETE_HOLD.cte("settled_hold"))
    ctes.append(ledger.INSERT_ENTRY.cte("charge"))
    if table is not None:
        ctes.append(insert_statement(table, prefix=ROW_PREFIX).cte("charged_row"))
    statement = ledger.COUNTERS["postgresql"].add_cte(*ctes)
    _SETTLEMENTS[key] = statement
    return statement


async def settle_hold(
    session: AsyncSession,
    hold: Hold,
    *,
    cost_micros: int,
    now: datetime,
    reference: str,
    row: tuple[sa.Table, Mapping[str, Any]] | None = None,
) -> None:
    """Replace the hold by the real charge, and insert `row` (a table and its columns'
    values: the request's record) with it. The caller commits (with whatever else belongs
    to the request's record), so the hold and the charge change in one transaction; holds
    read that in one statement, so no lock is needed here. A leased hold shrinks its lease's
    row instead (the caller tells the lease once committed: BudgetLeases.settled).
    PostgreSQL runs it all as one statement, SQLite as one each (it has no writing CTEs)."""
    params = ledger.charge_params(
        account_id=hold.account_id,
        key_hash=hold.key_hash,
        amount_micros=cost_micros,
        is_byok=hold.is_byok,
        now=now,
        reference=reference,
    )
    if hold.lease_id:
        hold_change = "lease"
        params["lease_id"] = hold.lease_id
        params["amount"] = hold.amount_micros
    elif hold.id:  # an unreserved hold has no row
        hold_change = "drop"
        params["hold_id"] = hold.id
    else:
        hold_change = ""
    if session.get_bind().dialect.name == "postgresql":
        table = None
        if row is not None:
            table, values = row
            for name, value in values.items():
                params[ROW_PREFIX + name] = value
        await fetch_rows(session, _settlement(hold_change, table), params)
        return
    if hold_change == "lease":
        await fetch_rows(session, _SHRINK_LEASE, params)
    elif hold_change == "drop":
        await fetch_rows(session, _DELETE_HOLD, params)
    await fetch_rows(session, ledger.INSERT_ENTRY, params)
    await fetch_rows(session, ledger.COUNTERS, params)
    if row is not None:
        table, values = row
        insert = _ROW_INSERTS.get(table)
        if insert is None:
            insert = _ROW_INSERTS[table] = insert_statement(table)
        await fetch_rows(session, insert, values)


async def drop_hold(session: AsyncSession, hold: Hold) -> None:
    """Give the reservation back as part of the caller's transaction. A leased hold has no
    row: its lease takes it back in memory (BudgetLeases.released)."""
    if hold.id:  # an unreserved or leased hold has no row
        await fetch_rows(session, _DELETE_HOLD, {"hold_id": hold.id})


async def delete_holds(session: AsyncSession, ids: list[str]) -> None:
    """Delete the holds (or leases) `ids` in the caller's transaction."""
    await execute_many(session, _DELETE_HOLD, [{"hold_id": hold_id} for hold_id in ids])


async def release_hold(session: AsyncSession, hold: Hold) -> None:
    """Give the reservation back (the request failed). Commits."""
    await drop_hold(session, hold)
    await session.commit()


T = TypeVar("T")


async def finish_uncancelled(work: Awaitable[T], bound: float = FINISH_TIMEOUT_SECONDS) -> T:
    """Run `work` (settling or releasing a hold) to its end even when the calling task is
    cancelled meanwhile — a gRPC deadline, a client cancel, a REST client that went away
    cancel the rpc's task, possibly more than once. The caller's cancellation is re-raised
    once the work is done; the work itself is bounded by `bound` seconds."""
    # One task (wait_for would add a second, a waiter future and a callback); it ends within
    # `bound` seconds, so the wait does too.
    return await wait_uncancelled(asyncio.ensure_future(_bounded(work, bound)))


async def _bounded(work: Awaitable[T], bound: float) -> T:
    """`work`, cancelled past `bound` seconds (TimeoutError)."""
    async with asyncio.timeout(bound):
        return await work


# --- a hold and the row that depends on it, in one statement (PostgreSQL) -------------------

# The bind-parameter prefix of the dependent row's columns in `reserve_and_insert`: the
# reserve's own parameters (id, account_id, created_at, ...) would otherwise clash.
DEPENDENT_PREFIX = "row_"


def reserve_and_insert(table: sa.Table, hold_column: str) -> sa.Insert:
    """PostgreSQL: the non-BYOK reserve (`_RESERVE`'s rules) as a data-modifying CTE, and an
    INSERT into `table` of one row whose `hold_column` is the new hold's id, taken FROM the
    CTE: when the budget refuses, the CTE returns no row, so neither row is written. Each of
    `table`'s other columns is bound as DEPENDENT_PREFIX + its name. RETURNING the hold's
    id. A constant: build it once per table."""
    reserved = _reserve_statement().cte("reserved_hold")
    names = [c.name for c in table.c]
    values = sa.select(
        *(
            reserved.c.id
            if c.name == hold_column
            else sa.bindparam(f"{DEPENDENT_PREFIX}{c.name}", type_=c.type)
            for c in table.c
        )
    ).select_from(reserved)
    return sa.insert(table).from_select(names, values).returning(table.c[hold_column])


async def place_hold_with_row(
    session: AsyncSession,
    statement: sa.Insert,
    row: dict[str, object],
    *,
    account_id: str,
    key_hash: str,
    amount_micros: int,
    now: datetime,
    ttl: timedelta = DEFAULT_HOLD_TTL,
) -> Hold | None:
    """PostgreSQL: `place_hold` (not BYOK) and the insert of `row` (its columns but the hold
    id, see `reserve_and_insert`) in one round trip, after the account lock. The hold, or
    None when the budget refused it: then nothing was written, and the caller asks
    `place_hold` (or the limits) why."""
    if amount_micros < 0:
        raise ValueError("a hold cannot be negative")
    await lock_account(session, account_id)
    hold = Hold(f"hold_{secrets.token_hex(12)}", account_id, key_hash, amount_micros, False)
    params = {
        **_budget_params(now),
        **_hold_values(hold.id, account_id, key_hash, amount_micros, now, ttl),
    }
    for name, value in row.items():
        params[DEPENDENT_PREFIX + name] = value
    reserved = await fetch_rows(session, statement, params)
    return hold if reserved else None
