"""/api/v1/keys and /api/v1/credits with the official `openrouter` SDK, unchanged."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
from openrouter import OpenRouter

from tests.conftest import Stack


async def test_sdk_key_lifecycle(stack: Stack, unique: str) -> None:
    workspace = await stack.admin.workspace(f"mgmt-{unique}")
    manager = await stack.admin.key(workspace, "manager", management=True)
    expires = (datetime.now(UTC) + timedelta(days=3)).replace(microsecond=0)

    async with OpenRouter(api_key=manager.key, server_url=stack.base_url) as sdk:
        created = await sdk.api_keys.create_async(
            name="worker",
            limit=12.5,
            limit_reset="weekly",
            include_byok_in_limit=True,
            expires_at=expires,
        )
        assert created.key.startswith("sk-gw-v1-")
        data = created.data
        assert data.name == "worker" and data.limit == 12.5 and data.limit_reset == "weekly"
        assert data.limit_remaining == 12.5 and data.include_byok_in_limit is True
        assert data.expires_at == expires and data.disabled is False
        assert data.workspace_id == workspace.id

        # The new key works on its own.
        async with httpx.AsyncClient() as client:
            own = await client.get(
                f"{stack.base_url}/key", headers={"Authorization": f"Bearer {created.key}"}
            )
        assert own.status_code == 200 and own.json()["data"]["limit"] == 12.5

        listed = await sdk.api_keys.list_async()
        assert {k.hash for k in listed.data} == {manager.hash, data.hash}
        fetched = await sdk.api_keys.get_async(hash=data.hash)
        assert fetched.data.label == data.label

        updated = await sdk.api_keys.update_async(
            hash=data.hash, name="renamed", disabled=True, limit=None
        )
        assert updated.data.name == "renamed" and updated.data.disabled is True
        assert updated.data.limit is None and updated.data.limit_remaining is None
        assert updated.data.updated_at is not None
        assert (await sdk.api_keys.list_async()).data.__len__() == 1  # disabled: hidden
        assert len((await sdk.api_keys.list_async(include_disabled=True)).data) == 2
        async with httpx.AsyncClient() as client:
            disabled = await client.get(
                f"{stack.base_url}/key", headers={"Authorization": f"Bearer {created.key}"}
            )
        assert disabled.status_code == 401

        deleted = await sdk.api_keys.delete_async(hash=data.hash)
        assert deleted.DELETED is True  # the SDK names the constant member so
    async with httpx.AsyncClient() as client:
        gone = await client.get(f"{stack.base_url}/keys/{data.hash}", headers=manager.headers)
    assert gone.status_code == 404
    assert gone.json()["error"]["code"] == 404


async def test_sdk_credits(stack: Stack, unique: str) -> None:
    workspace = await stack.admin.workspace(f"credits-{unique}")
    manager = await stack.admin.key(workspace, "manager", management=True)
    await stack.admin.credits(workspace, "20")
    await stack.admin.credits(workspace, "5.25")
    await stack.admin.charge(manager, "3.125")
    await stack.admin.charge(manager, "1", is_byok=True)  # paid to the provider directly
    async with OpenRouter(api_key=manager.key, server_url=stack.base_url) as sdk:
        credits = await sdk.credits.get_credits_async()
    assert credits.data.total_credits == 25.25
    assert credits.data.total_usage == 3.125


async def test_keys_of_other_accounts_are_invisible(stack: Stack, unique: str) -> None:
    mine = await stack.admin.workspace(f"mine-{unique}")
    theirs = await stack.admin.workspace(f"theirs-{unique}")
    manager = await stack.admin.key(mine, "manager", management=True)
    other = await stack.admin.key(theirs, "other")
    async with httpx.AsyncClient() as client:
        for method in ("GET", "DELETE"):
            response = await client.request(
                method, f"{stack.base_url}/keys/{other.hash}", headers=manager.headers
            )
            assert response.status_code == 404
        patched = await client.patch(
            f"{stack.base_url}/keys/{other.hash}",
            json={"disabled": True},
            headers=manager.headers,
        )
        assert patched.status_code == 404
        cross = await client.post(
            f"{stack.base_url}/keys",
            json={"name": "x", "workspace_id": theirs.id},
            headers=manager.headers,
        )
        assert cross.status_code == 404
        listing = await client.get(
            f"{stack.base_url}/keys", params={"workspace_id": theirs.id}, headers=manager.headers
        )
        assert listing.status_code == 404
    # Untouched.
    async with httpx.AsyncClient() as client:
        assert (await client.get(f"{stack.base_url}/key", headers=other.headers)).status_code == 200
