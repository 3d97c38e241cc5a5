"""Management service: /api/v1/keys and /api/v1/credits, for management keys only."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import grpc
from google.protobuf import struct_pb2
from sqlmodel.ext.asyncio.session import AsyncSession

from server.accounts import keys as key_store
from server.accounts.workspaces import (
    workspace_by_id,
    workspace_ids_of_account,
    workspace_of_account,
)
from server.auth import Authenticator, Principal
from server.billing.money import micros_to_json_number
from server.billing.settlements import Settlements
from server.billing.usage import ACCOUNT, read_usage
from server.clock import Clock, rfc3339
from server.contract import management_pb2, management_pb2_grpc
from server.db.engine import SessionFactory
from server.db.models import Account, ApiKey
from server.errors import bad_request
from server.guardrails.store import copy_assignments
from server.limits.key_status import key_status
from server.services.keys import limit_and_usage_fields
from server.services.rpc import (
    answer_with_status,
    metadata_of,
    nullable_string,
    nullable_timestamp,
    string_or_null,
    usd_or_null,
)


def _usd_or_null(value: struct_pb2.Value, param: str) -> int | None:
    return key_store.check_limit(usd_or_null(value, param))


def _expiry(value: struct_pb2.Value) -> datetime | None:
    text = string_or_null(value, "expires_at")
    return None if text is None else key_store.parse_expiry(text)


def _requested_workspace(
    request: management_pb2.ListKeysRequest | management_pb2.CreateKeyRequest,
) -> str | None:
    return request.workspace_id if request.HasField("workspace_id") else None


async def api_key_message(
    session: AsyncSession, key: ApiKey, account: Account, now: datetime
) -> management_pb2.ApiKey:
    """A key as the management routes (and the operator's) show it; never the key itself."""
    status = await key_status(session, key, account, now)
    return management_pb2.ApiKey(
        hash=key.hash,
        name=key.name,
        label=key.label,
        disabled=key.disabled,
        **limit_and_usage_fields(status),
        created_at=rfc3339(key.created_at),
        updated_at=nullable_timestamp(key.updated_at),
        last_used_at=nullable_timestamp(key.last_used_at),
        expires_at=nullable_timestamp(key.expires_at),
        creator_user_id=nullable_string(key.creator_user_id),
        external_user=nullable_string(key.external_user),
        workspace_id=key.workspace_id,
        is_management_key=key.is_management,
    )


@dataclass(frozen=True)
class KeyRotation:
    """POST /keys/{hash}/rotate's bounds (settings key_rotation_grace_seconds and
    key_rotation_max_grace_seconds)."""

    default_grace_seconds: int = 86400
    max_grace_seconds: int = 30 * 86400


class ManagementService(management_pb2_grpc.ManagementServicer):
    def __init__(
        self,
        auth: Authenticator,
        sessions: SessionFactory,
        clock: Clock,
        rotation: KeyRotation | None = None,
        settlements: Settlements | None = None,
    ) -> None:
        self._auth = auth
        self._sessions = sessions
        self._clock = clock
        self._rotation = rotation if rotation is not None else KeyRotation()
        # The account's charges still committing here are waited for: keys and credits
        # show usage (none given: nothing ever commits beside an answer).
        self._settlements = settlements if settlements is not None else Settlements()

    async def _principal(
        self, session: AsyncSession, context: grpc.aio.ServicerContext
    ) -> Principal:
        principal = await self._auth.authenticate_management(session, metadata_of(context))
        await self._settlements.settled(principal.account.id)
        return principal

    async def _key_message(
        self, session: AsyncSession, key: ApiKey, principal: Principal
    ) -> management_pb2.ApiKey:
        return await api_key_message(session, key, principal.account, self._clock.now())

    async def _workspace_ids(
        self, session: AsyncSession, principal: Principal, wanted: str | None
    ) -> list[str]:
        """The workspaces a request may act on: one named workspace of the caller's account,
        or by default the caller's own."""
        return [
            await workspace_of_account(
                session, principal.account.id, wanted, principal.workspace.id
            )
        ]

    async def ListKeys(
        self, request: management_pb2.ListKeysRequest, context: grpc.aio.ServicerContext
    ) -> management_pb2.ListKeysResponse:
        async with self._sessions() as session:
            principal = await self._principal(session, context)
            workspace_ids = await self._workspace_ids(
                session,
                principal,
                _requested_workspace(request),
            )
            keys = await key_store.list_keys(
                session,
                workspace_ids,
                self._clock.now(),
                include_disabled=request.include_disabled,
                include_expired=request.include_expired,
                offset=request.offset,
            )
            data = [await self._key_message(session, key, principal) for key in keys]
        return management_pb2.ListKeysResponse(data=data)

    async def CreateKey(
        self, request: management_pb2.CreateKeyRequest, context: grpc.aio.ServicerContext
    ) -> management_pb2.CreateKeyResponse:
        async with self._sessions() as session:
            principal = await self._principal(session, context)
            limit = _usd_or_null(request.limit, "limit") if request.HasField("limit") else None
            reset = (
                key_store.check_limit_reset(string_or_null(request.limit_reset, "limit_reset"))
                if request.HasField("limit_reset")
                else None
            )
            expires_at = _expiry(request.expires_at) if request.HasField("expires_at") else None
            creator = (
                string_or_null(request.creator_user_id, "creator_user_id")
                if request.HasField("creator_user_id")
                else None
            )
            external_user = None
            if request.HasField("external"):
                user = request.external.fields.get("user_id") or request.external.fields.get("id")
                external_user = user.string_value if user is not None else None
            now = self._clock.now()
            (workspace_id,) = await self._workspace_ids(
                session,
                principal,
                _requested_workspace(request),
            )
            workspace = await workspace_by_id(session, workspace_id)
            assert workspace is not None
            key, plaintext = await key_store.create_key(
                session,
                workspace=workspace,
                name=request.name,
                now=now,
                limit=key_store.KeyLimit(limit, reset),
                include_byok_in_limit=request.include_byok_in_limit,
                expires_at=expires_at,
                creator_user_id=creator,
                external_user=external_user,
            )
            await session.commit()
            message = await self._key_message(session, key, principal)
        await answer_with_status(context, 201)
        return management_pb2.CreateKeyResponse(data=message, key=plaintext)

    async def _account_key(
        self, session: AsyncSession, principal: Principal, key_hash: str
    ) -> ApiKey:
        workspace_ids = await workspace_ids_of_account(session, principal.account.id)
        return await key_store.find_key(session, key_hash, workspace_ids)

    async def GetKey(
        self, request: management_pb2.GetKeyRequest, context: grpc.aio.ServicerContext
    ) -> management_pb2.KeyResponse:
        async with self._sessions() as session:
            principal = await self._principal(session, context)
            key = await self._account_key(session, principal, request.hash)
            return management_pb2.KeyResponse(data=await self._key_message(session, key, principal))

    async def UpdateKey(
        self, request: management_pb2.UpdateKeyRequest, context: grpc.aio.ServicerContext
    ) -> management_pb2.KeyResponse:
        async with self._sessions() as session:
            principal = await self._principal(session, context)
            # Validate everything before touching the row: nothing is half-applied.
            changes: dict[str, object] = {}
            if request.HasField("name"):
                changes["name"] = key_store.check_name(request.name)
            if request.HasField("disabled"):
                changes["disabled"] = request.disabled
            if request.HasField("limit"):
                changes["limit_micros"] = _usd_or_null(request.limit, "limit")
            if request.HasField("limit_reset"):
                changes["limit_reset"] = key_store.check_limit_reset(
                    string_or_null(request.limit_reset, "limit_reset")
                )
            if request.HasField("include_byok_in_limit"):
                changes["include_byok_in_limit"] = request.include_byok_in_limit
            key = await self._account_key(session, principal, request.hash)
            if request.HasField("workspace_id"):
                (changes["workspace_id"],) = await self._workspace_ids(
                    session, principal, request.workspace_id
                )
            await key_store.update_key(session, key, changes, self._clock.now())
            await session.commit()
            return management_pb2.KeyResponse(data=await self._key_message(session, key, principal))

    async def DeleteKey(
        self, request: management_pb2.DeleteKeyRequest, context: grpc.aio.ServicerContext
    ) -> management_pb2.DeleteKeyResponse:
        async with self._sessions() as session:
            principal = await self._principal(session, context)
            key = await self._account_key(session, principal, request.hash)
            await key_store.delete_key(session, key)
            await session.commit()
        return management_pb2.DeleteKeyResponse(deleted=True)

    async def RotateKey(
        self, request: management_pb2.RotateKeyRequest, context: grpc.aio.ServicerContext
    ) -> management_pb2.RotateKeyResponse:
        """A new key in the old one's place; the old one expires after the grace period (at
        once with 0), or at its own expiry when that comes first."""
        grace = (
            request.grace_seconds
            if request.HasField("grace_seconds")
            else self._rotation.default_grace_seconds
        )
        if not 0 <= grace <= self._rotation.max_grace_seconds:
            raise bad_request(
                f"grace_seconds must be 0 to {self._rotation.max_grace_seconds}",
                param="grace_seconds",
            )
        async with self._sessions() as session:
            principal = await self._principal(session, context)
            old = await self._account_key(session, principal, request.hash)
            now = self._clock.now()
            if old.expires_at is not None and old.expires_at <= now:
                raise bad_request("an expired key cannot be rotated", param="hash")
            workspace = await workspace_by_id(session, old.workspace_id)
            assert workspace is not None
            new, plaintext = await key_store.create_key(
                session,
                workspace=workspace,
                name=old.name,
                now=now,
                limit=key_store.KeyLimit(old.limit_micros, old.limit_reset),
                include_byok_in_limit=old.include_byok_in_limit,
                expires_at=old.expires_at,
                management=old.is_management,
                creator_user_id=old.creator_user_id,
                external_user=old.external_user,
                intern_id=old.intern_id,
            )
            await copy_assignments(session, old.hash, new.hash, now)
            ends = now + timedelta(seconds=grace)
            if old.expires_at is None or ends < old.expires_at:
                await key_store.update_key(session, old, {"expires_at": ends}, now)
            await session.commit()
            message = await self._key_message(session, new, principal)
            rotated = await self._key_message(session, old, principal)
        await answer_with_status(context, 201)
        return management_pb2.RotateKeyResponse(data=message, key=plaintext, rotated=rotated)

    async def GetCredits(
        self, request: management_pb2.GetCreditsRequest, context: grpc.aio.ServicerContext
    ) -> management_pb2.CreditsResponse:
        async with self._sessions() as session:
            principal = await self._principal(session, context)
            usage = await read_usage(session, ACCOUNT, principal.account.id, self._clock.now())
        return management_pb2.CreditsResponse(
            data=management_pb2.Credits(
                total_credits=micros_to_json_number(principal.account.credits_purchased_micros),
                total_usage=micros_to_json_number(usage.spend["all"]),
            )
        )
