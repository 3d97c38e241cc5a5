"""The operator's domain in-process: the operator key (issued once, hashed, a private file,
rotation, two first starts at once) and the rules the CLI and /api/v1/workspaces share
(server/accounts/provisioning.py)."""

from __future__ import annotations

import asyncio
import hashlib
from decimal import Decimal
from pathlib import Path

import pytest

from server.accounts.operator import (
    ensure_operator_key,
    is_operator_key,
    operator_key_path,
    rotate_operator_key,
)
from server.accounts.provisioning import (
    add_workspace_credits,
    issue_management_key,
    list_workspaces,
    workspace_for_operator,
)
from server.db.models import OperatorKey
from server.errors import GatewayError
from testkit.domain import Domain


async def _accepted(domain: Domain, key: str) -> bool:
    async with domain.sessions() as session:
        return await is_operator_key(session, key)


async def test_the_operator_key_is_issued_once_hashed_into_a_private_file(
    any_domain: Domain, tmp_path: Path
) -> None:
    domain = any_domain
    data_dir = tmp_path / "data"
    first = await ensure_operator_key(domain.sessions, data_dir, domain.clock.now())
    assert first.created and first.present and first.path == operator_key_path(data_dir)
    key = first.path.read_text().strip()
    assert oct(first.path.stat().st_mode)[-3:] == "600"
    (row,) = await domain.rows(OperatorKey)
    assert row.key_hash == hashlib.sha256(key.encode()).hexdigest()  # the hash only
    again = await ensure_operator_key(domain.sessions, data_dir, domain.clock.now())
    assert not again.created and again.present and first.path.read_text().strip() == key
    elsewhere = await ensure_operator_key(domain.sessions, tmp_path / "other", domain.clock.now())
    assert not elsewhere.created and not elsewhere.present  # issued, but not on this host
    assert await _accepted(domain, key)
    assert not await _accepted(domain, key[:-1] + ("0" if key[-1] != "0" else "1"))
    assert not await _accepted(domain, "sk-gw-v1-" + key.removeprefix("sk-gw-op-"))

    path = await rotate_operator_key(domain.sessions, data_dir, domain.clock.now())
    new = path.read_text().strip()
    assert new != key and await _accepted(domain, new) and not await _accepted(domain, key)
    assert oct(path.stat().st_mode)[-3:] == "600"
    assert sorted(p.name for p in data_dir.iterdir()) == ["operator-key"]  # no temporaries


async def test_two_first_starts_at_once_leave_one_key_and_its_file(
    any_domain: Domain, tmp_path: Path
) -> None:
    domain = any_domain
    data_dir = tmp_path / "data"
    results = await asyncio.gather(
        *(ensure_operator_key(domain.sessions, data_dir, domain.clock.now()) for _ in range(4)),
        return_exceptions=True,
    )
    created = [r for r in results if not isinstance(r, BaseException) and r.created]
    assert len(created) >= 1 and await domain.count(OperatorKey) == 1
    # Whoever lost the race wrote nothing over the winner's file: the file opens the door.
    assert await _accepted(domain, operator_key_path(data_dir).read_text().strip())
    assert sorted(p.name for p in data_dir.iterdir()) == ["operator-key"]


@pytest.mark.parametrize(
    ("amount", "words"),
    [
        ("0", "greater than 0"),
        ("-1", "no sign"),
        ("0.0000015", "micro-dollars"),
        ("1000000000.000001", "1e9"),
        ("ten", "decimal number of USD"),
        ("NaN", "decimal number of USD"),
    ],
)
async def test_credit_amounts_are_refused_not_rounded(
    domain: Domain, amount: str, words: str
) -> None:
    issued = await domain.funded_key(f"refused-{abs(hash(amount)) % 10_000}", usd="0")
    async with domain.sessions() as session:
        workspace = await workspace_for_operator(session, issued.workspace.id)
        with pytest.raises(GatewayError) as refused:
            await add_workspace_credits(
                session, workspace, amount, domain.clock.now(), reference="unit"
            )
    assert refused.value.status == 400 and words in refused.value.message
    assert refused.value.metadata == {"param": "amount"}


async def test_credits_land_exactly_and_purchases_stay_within_1e9(domain: Domain) -> None:
    issued = await domain.funded_key("bought", usd="0")
    async with domain.sessions() as session:
        workspace = await workspace_for_operator(session, issued.workspace.id)
        entry = await add_workspace_credits(
            session, workspace, Decimal("999999999.999999"), domain.clock.now(), reference="u"
        )
        bought = entry.amount_micros
        await session.commit()
        with pytest.raises(GatewayError) as beyond:
            await add_workspace_credits(
                session, workspace, "0.000002", domain.clock.now(), reference="u", param="--amount"
            )
        await session.rollback()
        workspace = await workspace_for_operator(session, issued.workspace.id)
        key, plaintext = await issue_management_key(
            session, workspace, "first admin", domain.clock.now()
        )
        management, key_workspace = key.is_management, key.workspace_id
        await session.commit()
        views, total = await list_workspaces(session, domain.clock.now(), 0, 100)
        with pytest.raises(GatewayError) as unknown:
            await workspace_for_operator(session, "ws_nothing")
    assert bought == 999_999_999_999_999
    assert beyond.value.status == 400 and beyond.value.message.startswith("--amount ")
    assert management and plaintext.startswith("sk-gw-v1-")
    assert key_workspace == issued.workspace.id
    view = next(v for v in views if v.workspace.id == issued.workspace.id)
    assert view.document()["total_credits"] == 999999999.999999 and total == len(views)
    assert unknown.value.status == 404
