"""Keys service: GET /api/v1/key."""

from __future__ import annotations

from typing import Any

import grpc

from server.auth import Authenticator
from server.billing.money import micros_to_json_number
from server.clock import Clock
from server.contract import keys_pb2, keys_pb2_grpc
from server.db.engine import SessionFactory
from server.limits.key_status import KeyStatus, key_status
from server.services.rpc import metadata_of, null, nullable_string, nullable_timestamp, nullable_usd

# The deprecated rate_limit member existing clients still require; it carries no policy.
LEGACY_RATE_LIMIT = keys_pb2.LegacyRateLimit(
    requests=-1, interval="10s", note="deprecated: ignore this field"
)


def limit_and_usage_fields(status: KeyStatus) -> dict[str, Any]:
    """The limit and usage members GET /key and the /keys routes share."""
    key, usage = status.key, status.usage
    return {
        "limit": nullable_usd(key.limit_micros),
        "limit_reset": nullable_string(key.limit_reset),
        "limit_remaining": nullable_usd(status.limit_remaining_micros),
        "include_byok_in_limit": key.include_byok_in_limit,
        "usage": micros_to_json_number(usage.spend["all"]),
        "usage_daily": micros_to_json_number(usage.spend["day"]),
        "usage_weekly": micros_to_json_number(usage.spend["week"]),
        "usage_monthly": micros_to_json_number(usage.spend["month"]),
        "byok_usage": micros_to_json_number(usage.byok["all"]),
        "byok_usage_daily": micros_to_json_number(usage.byok["day"]),
        "byok_usage_weekly": micros_to_json_number(usage.byok["week"]),
        "byok_usage_monthly": micros_to_json_number(usage.byok["month"]),
    }


def current_key_message(status: KeyStatus) -> keys_pb2.CurrentKey:
    key = status.key
    free = status.free_model_daily_requests
    return keys_pb2.CurrentKey(
        label=key.label,
        **limit_and_usage_fields(status),
        is_free_tier=status.is_free_tier,
        free_model_daily_requests=keys_pb2.FreeModelDailyRequests(
            used=free.used, limit=free.limit, remaining=free.remaining
        ),
        is_management_key=key.is_management,
        is_provisioning_key=key.is_management,
        workspace_id=nullable_string(key.workspace_id),
        organization_id=null(),
        creator_user_id=nullable_string(key.creator_user_id),
        expires_at=nullable_timestamp(key.expires_at),
        allowed_data_regions=["global"],
        effective_budget=null(),
        rate_limit=LEGACY_RATE_LIMIT,
    )


class KeysService(keys_pb2_grpc.KeysServicer):
    def __init__(self, auth: Authenticator, sessions: SessionFactory, clock: Clock) -> None:
        self._auth = auth
        self._sessions = sessions
        self._clock = clock

    async def GetCurrentKey(
        self, request: keys_pb2.GetCurrentKeyRequest, context: grpc.aio.ServicerContext
    ) -> keys_pb2.CurrentKeyResponse:
        async with self._sessions() as session:
            principal = await self._auth.authenticate(session, metadata_of(context))
            status = await key_status(session, principal.key, principal.account, self._clock.now())
        return keys_pb2.CurrentKeyResponse(data=current_key_message(status))
