"""LazySession (server/transcription/session.py): the request's session is made only when
something uses it, and closed only if it was made."""

from __future__ import annotations

import sqlalchemy as sa

from server.db.models import Account
from server.transcription.session import LazySession
from testkit.domain import Domain


async def test_an_unused_session_is_never_made(domain: Domain) -> None:
    made = []

    def factory() -> object:
        made.append(1)
        return domain.sessions()

    lazy = LazySession(factory)  # type: ignore[arg-type]
    async with lazy as session:
        assert not session.in_transaction()
    assert made == [] and not lazy.opened


async def test_a_used_session_reads_and_is_closed(domain: Domain) -> None:
    issued = await domain.funded_key("lazy-session")
    lazy = LazySession(domain.sessions)
    async with lazy as session:
        assert not session.in_transaction()
        account = await session.get(Account, issued.workspace.account_id)
        assert account is not None and lazy.opened
        assert session.in_transaction()
        count = (await session.exec(sa.select(sa.func.count()).select_from(Account))).one()
        assert count[0] >= 1
    assert not lazy._session.in_transaction()  # type: ignore[union-attr]  # closed on exit
