"""GET /api/v1/key through Envoy, on SQLite and PostgreSQL, and with the official SDK."""

from __future__ import annotations

import asyncio

import httpx
from openrouter import OpenRouter

from tests.conftest import Stack

REFERENCE_FIELDS = {
    "label",
    "limit",
    "limit_reset",
    "limit_remaining",
    "include_byok_in_limit",
    "usage",
    "usage_daily",
    "usage_weekly",
    "usage_monthly",
    "byok_usage",
    "byok_usage_daily",
    "byok_usage_weekly",
    "byok_usage_monthly",
    "is_free_tier",
    "free_model_daily_requests",
}


async def test_key_status_has_every_reference_field_with_nulls(stack: Stack, unique: str) -> None:
    workspace = await stack.admin.workspace(f"ks-{unique}")
    issued = await stack.admin.key(workspace, "plain")
    async with httpx.AsyncClient() as client:
        response = await client.get(f"{stack.base_url}/key", headers=issued.headers)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert not any(h.lower().startswith("x-ratelimit") for h in response.headers)
    assert not any(h.lower().startswith("grpc-") for h in response.headers)
    data = response.json()["data"]
    assert REFERENCE_FIELDS <= data.keys()
    assert data["limit"] is None and data["limit_remaining"] is None
    assert data["limit_reset"] is None
    assert data["usage"] == 0 and data["byok_usage_monthly"] == 0
    assert data["is_free_tier"] is True  # never bought credits
    assert data["free_model_daily_requests"] == {"used": 0, "limit": 50, "remaining": 50}
    assert data["label"].startswith("sk-gw-v1-") and issued.key not in response.text
    assert data["is_management_key"] is False


async def test_key_status_reports_limits_usage_and_tier(stack: Stack, unique: str) -> None:
    workspace = await stack.admin.workspace(f"ks2-{unique}")
    issued = await stack.admin.key(
        workspace, "capped", limit="5", limit_reset="daily", include_byok_in_limit=True
    )
    await stack.admin.credits(workspace, "9")
    await stack.admin.charge(issued, "1.25")
    await stack.admin.charge(issued, "0.5", is_byok=True)
    async with httpx.AsyncClient() as client:
        data = (await client.get(f"{stack.base_url}/key", headers=issued.headers)).json()["data"]
    assert data["limit"] == 5 and data["limit_reset"] == "daily"
    assert data["usage"] == 1.25 and data["usage_daily"] == 1.25
    assert data["usage_weekly"] == 1.25 and data["usage_monthly"] == 1.25
    assert data["byok_usage"] == 0.5 and data["byok_usage_daily"] == 0.5
    assert data["limit_remaining"] == 3.25  # BYOK counts: include_byok_in_limit
    assert data["is_free_tier"] is False
    assert data["free_model_daily_requests"]["limit"] == 1000  # 9 credits: the higher tier


async def test_official_sdk_parses_key_metadata(stack: Stack, unique: str) -> None:
    workspace = await stack.admin.workspace(f"sdk-{unique}")
    issued = await stack.admin.key(workspace, "sdk", limit="2.5", limit_reset="monthly")

    def call() -> object:
        with OpenRouter(api_key=issued.key, server_url=stack.base_url) as client:
            return client.api_keys.get_current_key_metadata()

    result = await asyncio.to_thread(call)
    data = result.data  # type: ignore[attr-defined]
    assert data.limit == 2.5
    assert data.limit_reset == "monthly"
    assert data.limit_remaining == 2.5
    assert data.usage_daily == 0
    assert data.free_model_daily_requests.limit == 50
    assert data.is_management_key is False
