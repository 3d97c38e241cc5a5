"""Amounts are exact and bounded everywhere they enter or leave: 0 to 1e9 USD, at most six
decimal places (finer is refused, not rounded), balances within 1e9 USD; over REST a value
out of bounds is a 400 naming the field, from the CLI one clear line (in-process:
tests/unit/test_cli_commands.py); large balances come
back as the exact decimal; and every malformed input is a documented error, never a 500 or
a traceback."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import grpc
import httpx
import pytest

from server.db.models import ApiKey, Guardrail
from testkit.admin import IssuedKey
from tests.conftest import Stack
from tests.test_grpc import _error_info

# The database is the point: on SQLite and PostgreSQL (see tests/conftest.py).
pytestmark = pytest.mark.both_backends

# The CLI's money bounds (refusals in one clear line, exact amounts, the balance bound)
# are checked in-process: tests/unit/test_cli_commands.py.


# --- REST ---------------------------------------------------------------------------------


@pytest.fixture
async def manager(stack: Stack, unique: str) -> IssuedKey:
    workspace = await stack.admin.workspace(f"bounds-{unique}")
    return await stack.admin.key(workspace, "manager", management=True)


async def _post(stack: Stack, key: IssuedKey, path: str, raw: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=60) as client:
        return await client.post(
            f"{stack.base_url}{path}",
            content=raw.encode(),
            headers={**key.headers, "content-type": "application/json"},
        )


@pytest.mark.parametrize(
    ("path", "raw", "param"),
    [
        ("/keys", '{"name": "k", "limit": 1e18}', "limit"),
        ("/keys", '{"name": "k", "limit": 1e308}', "limit"),
        ("/keys", '{"name": "k", "limit": 0.0000015}', "limit"),
        ("/keys", '{"name": "a\\u0000b"}', "name"),
        ("/keys", '{"name": "k", "creator_user_id": "u\\u0000"}', "creator_user_id"),
        (
            "/guardrails",
            '{"name": "g", "max_cost_per_request_usd": 1e18}',
            "max_cost_per_request_usd",
        ),
        (
            "/guardrails",
            '{"name": "g", "max_video_duration_seconds": 1e18}',
            "max_video_duration_seconds",
        ),
        ("/guardrails", '{"name": "g\\u0000"}', "name"),
        ("/guardrails", '{"name": "g", "description": "d\\u0000"}', "description"),
    ],
)
async def test_rest_refuses_huge_inexact_and_nul_values(
    stack: Stack, manager: IssuedKey, path: str, raw: str, param: str
) -> None:
    response = await _post(stack, manager, path, raw)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["metadata"] == {"param": param}
    workspace = manager.workspace.id
    assert await stack.admin.count(ApiKey, ApiKey.workspace_id == workspace) == 1  # manager
    assert await stack.admin.count(Guardrail, Guardrail.workspace_id == workspace) == 0


async def test_large_balances_and_limits_come_back_exact(stack: Stack, manager: IssuedKey) -> None:
    await stack.admin.credits(manager.workspace, "123456789.123456")
    capped = await _post(stack, manager, "/keys", '{"name": "capped", "limit": 987654321.654321}')
    assert capped.status_code == 201, capped.text
    capped_key = capped.json()["key"]
    async with httpx.AsyncClient(timeout=60) as client:
        credits = await client.get(f"{stack.base_url}/credits", headers=manager.headers)
        key = await client.get(
            f"{stack.base_url}/key", headers={"Authorization": f"Bearer {capped_key}"}
        )
    # Parsed as decimals: exactly the amounts stored, not a float's neighbour.
    data: Any = json.loads(credits.text, parse_float=Decimal)["data"]
    assert data["total_credits"] == Decimal("123456789.123456"), credits.text
    assert '"total_credits":123456789.123456' in credits.text.replace(" ", "")
    status: Any = json.loads(key.text, parse_float=Decimal)["data"]
    assert status["limit"] == Decimal("987654321.654321"), key.text
    assert status["limit_remaining"] == Decimal("987654321.654321"), key.text
    top = await _post(stack, manager, "/keys", '{"name": "top", "limit": 999999999.999999}')
    assert top.status_code == 201, top.text
    assert json.loads(top.text, parse_float=Decimal)["data"]["limit"] == Decimal("999999999.999999")


# --- gRPC -----------------------------------------------------------------------------------


async def test_garbage_protobuf_is_invalid_argument_with_error_info(
    stack: Stack, manager: IssuedKey
) -> None:
    async with grpc.aio.insecure_channel(stack.grpc_target) as channel:
        for method in (
            "/gateway.v1.Management/CreateKey",
            "/gateway.v1.Videos/CreateVideo",
            "/gateway.v1.Audio/CreateTranscription",
        ):
            call = channel.unary_unary(method, request_serializer=None)
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await call(b"\xff\xff\xff\xff\x0f garbage", metadata=manager.metadata, timeout=10)
            assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT, method
            info = _error_info(failure.value)
            assert info.metadata["http_status"] == "400"
