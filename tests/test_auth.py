"""Authentication: every way a key can be wrong is a 401; a non-management key on a
management route is a 403. Through Envoy (REST) and directly over gRPC."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import grpc
import httpx
import pytest

from server.accounts.keys import generate_key
from server.contract import keys_pb2, keys_pb2_grpc, management_pb2, management_pb2_grpc
from tests.conftest import Stack


async def _status(stack: Stack, headers: dict[str, str], path: str = "/key") -> httpx.Response:
    async with httpx.AsyncClient() as client:
        return await client.get(f"{stack.base_url}{path}", headers=headers)


@pytest.mark.parametrize(
    ("headers", "message_part"),
    [
        ({}, "Missing Authorization"),
        ({"Authorization": "Basic dXNlcjpwYXNz"}, "Malformed"),
        ({"Authorization": "Bearer"}, "Malformed"),
        ({"Authorization": "Bearer not-a-key"}, "Invalid API key"),
        ({"Authorization": f"Bearer {generate_key()}"}, "Invalid API key"),
    ],
    ids=["missing", "basic-scheme", "empty-bearer", "malformed-key", "unknown-key"],
)
async def test_bad_credentials_are_401(
    stack: Stack, headers: dict[str, str], message_part: str
) -> None:
    response = await _status(stack, headers)
    assert response.status_code == 401
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["error"]["code"] == 401
    assert message_part in body["error"]["message"]


async def test_disabled_and_expired_keys_are_401(stack: Stack, unique: str) -> None:
    workspace = await stack.admin.workspace(f"auth-{unique}")
    disabled = await stack.admin.key(workspace, "disabled")
    await stack.admin.update_key(disabled, disabled=True)
    expiring = await stack.admin.key(
        workspace, "expiring", expires_at=datetime.now(UTC) + timedelta(hours=1)
    )
    assert (await _status(stack, expiring.headers)).status_code == 200
    await stack.admin.update_key(expiring, expires_at=datetime.now(UTC) - timedelta(seconds=1))

    response = await _status(stack, disabled.headers)
    assert response.status_code == 401
    assert response.json()["error"]["message"] == "API key is disabled"
    response = await _status(stack, expiring.headers)
    assert response.status_code == 401
    assert response.json()["error"]["message"] == "API key has expired"


async def test_scheme_is_case_insensitive(stack: Stack, unique: str) -> None:
    workspace = await stack.admin.workspace(f"case-{unique}")
    issued = await stack.admin.key(workspace)
    response = await _status(stack, {"Authorization": f"bearer {issued.key}"})
    assert response.status_code == 200


@pytest.mark.parametrize("path", ["/keys", "/credits", "/keys/" + "0" * 64])
async def test_non_management_key_on_management_route_is_403(
    stack: Stack, unique: str, path: str
) -> None:
    workspace = await stack.admin.workspace(f"m403-{unique}")
    issued = await stack.admin.key(workspace)
    response = await _status(stack, issued.headers, path)
    assert response.status_code == 403
    assert response.json() == {
        "error": {"code": 403, "message": "This operation requires a management key"}
    }


async def test_grpc_callers_get_canonical_codes(stack: Stack, unique: str) -> None:
    workspace = await stack.admin.workspace(f"grpc-auth-{unique}")
    issued = await stack.admin.key(workspace)
    async with grpc.aio.insecure_channel(stack.grpc_target) as channel:
        keys = keys_pb2_grpc.KeysStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await keys.GetCurrentKey(keys_pb2.GetCurrentKeyRequest())
        assert missing.value.code() == grpc.StatusCode.UNAUTHENTICATED

        management = management_pb2_grpc.ManagementStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as denied:
            await management.GetCredits(
                management_pb2.GetCreditsRequest(), metadata=issued.metadata
            )
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED

        ok = await keys.GetCurrentKey(keys_pb2.GetCurrentKeyRequest(), metadata=issued.metadata)
        assert ok.data.label.startswith("sk-gw-v1-")
