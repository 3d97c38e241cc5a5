"""Issue 29 item 10 over REST: a credit amount written as a string is read by the one strict
grammar (server/billing/money.py `parse_usd`), so Python's quirks ("1_000" as 1,000 USD,
"\\u0665" as 5, " 5", "+5") are 400s naming the field and add nothing."""

from __future__ import annotations

import httpx
import pytest

from server.db.models import LedgerEntry
from tests.conftest import Stack
from tests.test_management import _operator


@pytest.mark.parametrize("amount", ["1_000", "\u0665", " 5", "5 ", "+5", "1e3", "-5"])
async def test_credit_amount_strings_outside_the_grammar_are_refused(
    stack: Stack, unique: str, amount: str
) -> None:
    workspace = await stack.admin.workspace(f"grammar-{unique}")
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=60) as client:
        refused = await client.post(
            f"/workspaces/{workspace.id}/credits",
            json={"amount": amount},
            headers=_operator(stack),
        )
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["metadata"] == {"param": "amount"}
    assert "decimal number of USD" in error["message"]
    assert await stack.admin.count(LedgerEntry, LedgerEntry.account_id == workspace.account_id) == 0
