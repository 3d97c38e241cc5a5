"""Direct access to the gateway's database from tests, through the domain modules."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlmodel import SQLModel, func, select

from server.accounts import keys as key_store
from server.accounts import workspaces
from server.billing.ledger import add_credits, charge_params, record_charge
from server.billing.money import usd_to_micros
from server.clock import Clock, SystemClock
from server.db.engine import SessionFactory
from server.db.models import ApiKey, CreditHold, Intern, Workspace
from testkit.eventually import eventually


@dataclass
class IssuedKey:
    key: str
    hash: str
    workspace: Workspace

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.key}"),)


class Admin:
    def __init__(self, sessions: SessionFactory, clock: Clock | None = None) -> None:
        self.sessions = sessions
        self.clock = clock or SystemClock()

    async def workspace(self, name: str, *, intern_programme: bool = False) -> Workspace:
        async with self.sessions() as session:
            workspace = await workspaces.create_workspace(
                session, name, self.clock.now(), intern_programme=intern_programme
            )
            await session.commit()
            return workspace

    async def intern(self, workspace: Workspace, name: str) -> Intern:
        async with self.sessions() as session:
            intern = await workspaces.create_intern(session, workspace, name, self.clock.now())
            await session.commit()
            return intern

    async def key(
        self,
        workspace: Workspace,
        name: str = "test key",
        *,
        intern_id: str | None = None,
        management: bool = False,
        limit: str | None = None,
        limit_reset: str | None = None,
        include_byok_in_limit: bool = False,
        expires_at: datetime | None = None,
    ) -> IssuedKey:
        async with self.sessions() as session:
            key, plaintext = await key_store.create_key(
                session,
                workspace=workspace,
                name=name,
                now=self.clock.now(),
                limit=key_store.KeyLimit(
                    None if limit is None else usd_to_micros(limit), limit_reset
                ),
                include_byok_in_limit=include_byok_in_limit,
                expires_at=expires_at,
                management=management,
                intern_id=intern_id,
            )
            await session.commit()
            return IssuedKey(key=plaintext, hash=key.hash, workspace=workspace)

    async def credits(self, workspace: Workspace, amount: str) -> None:
        async with self.sessions() as session:
            await add_credits(
                session, workspace.account_id, usd_to_micros(amount), self.clock.now()
            )
            await session.commit()

    async def charge(
        self,
        issued: IssuedKey,
        amount: str | Decimal,
        *,
        is_byok: bool = False,
        at: datetime | None = None,
    ) -> None:
        async with self.sessions() as session:
            charge = charge_params(
                account_id=issued.workspace.account_id,
                key_hash=issued.hash,
                amount_micros=usd_to_micros(amount),
                is_byok=is_byok,
                now=at or self.clock.now(),
            )
            await record_charge(session, charge)
            await session.commit()

    async def count(self, table: type[SQLModel], *where: Any) -> int:
        """Rows of `table` matching `where`."""
        async with self.sessions() as session:
            statement = select(func.count()).select_from(table).where(*where)
            return int((await session.exec(statement)).one())

    async def no_hold_left(self, *where: Any, within: float = 5.0) -> None:
        """No credit hold matching `where` is left, nor a budget lease. A lease of a key's
        budget (server/limits/leases.py) goes back within a second of its last request's
        end, and only once every request admitted on it settled or gave its amount back:
        the wait proves both."""

        async def none_left() -> bool:
            return await self.count(CreditHold, *where) == 0

        await eventually(none_left, within=within, message="no credit hold or lease left")

    async def update_key(self, issued: IssuedKey, **values: object) -> None:
        async with self.sessions() as session:
            key = await session.get(ApiKey, issued.hash)
            assert key is not None
            for name, value in values.items():
                setattr(key, name, value)
            session.add(key)
            await session.commit()
