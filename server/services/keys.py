"""Keys service: GET /api/v1/key."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import grpc
from google.protobuf import struct_pb2

from server.auth import Authenticator
from server.billing.money import micros_to_json_number
from server.billing.settlements import Settlements
from server.clock import Clock, rfc3339
from server.contract import keys_pb2, keys_pb2_grpc
from server.db.driver import HotReads
from server.db.engine import SessionFactory
from server.db.models import ApiKey, Workspace
from server.guardrails.cache import GuardrailsCache
from server.guardrails.policy import Guardrails
from server.limits.guardrail_budgets import BudgetLayer, budget_layers, effective_budget
from server.limits.key_status import (
    KeyStatus,
    key_status_and_stamp,
    read_key_status_and_stamp,
)
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


def budget_message(layer: BudgetLayer) -> keys_pb2.KeyBudget:
    return keys_pb2.KeyBudget(
        budget_id=null(),
        guardrail_id=nullable_string(layer.guardrail_id),
        include_byok=layer.include_byok,
        limit_usd=micros_to_json_number(layer.limit_micros),
        remaining_usd=micros_to_json_number(layer.remaining_micros),
        reset_interval=nullable_string(layer.reset_interval),
        resets_at=nullable_timestamp(layer.resets_at),
        scope=layer.scope,
        spend_usd=micros_to_json_number(layer.spent_micros),
    )


def _effective(layers: list[BudgetLayer]) -> struct_pb2.Value:
    """The effective budget as a JSON object: budget_message's members, built directly
    (json_format's generic walk cost more than the rest of the response)."""
    layer = effective_budget(layers)
    if layer is None:
        return null()
    value = struct_pb2.Value()
    value.struct_value.update(
        {
            "budget_id": None,
            "guardrail_id": layer.guardrail_id,
            "include_byok": layer.include_byok,
            "limit_usd": micros_to_json_number(layer.limit_micros),
            "remaining_usd": micros_to_json_number(layer.remaining_micros),
            "reset_interval": layer.reset_interval,
            "resets_at": None if layer.resets_at is None else rfc3339(layer.resets_at),
            "scope": layer.scope,
            "spend_usd": micros_to_json_number(layer.spent_micros),
        }
    )
    return value


def key_fields(key: ApiKey, workspace: Workspace | None = None) -> keys_pb2.CurrentKey:
    """The members of GET /key that depend on the key and workspace rows alone."""
    return keys_pb2.CurrentKey(
        workspace_name="" if workspace is None else workspace.name,
        intern_programme=workspace is not None and workspace.intern_programme,
        label=key.label,
        limit=nullable_usd(key.limit_micros),
        limit_reset=nullable_string(key.limit_reset),
        include_byok_in_limit=key.include_byok_in_limit,
        is_management_key=key.is_management,
        is_provisioning_key=key.is_management,
        workspace_id=nullable_string(key.workspace_id),
        organization_id=null(),
        creator_user_id=nullable_string(key.creator_user_id),
        expires_at=nullable_timestamp(key.expires_at),
        allowed_data_regions=["global"],
        rate_limit=LEGACY_RATE_LIMIT,
    )


def current_key_message(
    status: KeyStatus,
    layers: list[BudgetLayer] | None = None,
    fields: keys_pb2.CurrentKey | None = None,
) -> keys_pb2.CurrentKey:
    """GET /key's data: `fields` (key_fields of the key, built once per cached key by the
    service) completed with what changes from request to request."""
    layers = layers or []
    message = keys_pb2.CurrentKey()
    message.CopyFrom(fields if fields is not None else key_fields(status.key))
    usage, free = status.usage, status.free_model_daily_requests
    message.limit_remaining.CopyFrom(nullable_usd(status.limit_remaining_micros))
    message.usage = micros_to_json_number(usage.spend["all"])
    message.usage_daily = micros_to_json_number(usage.spend["day"])
    message.usage_weekly = micros_to_json_number(usage.spend["week"])
    message.usage_monthly = micros_to_json_number(usage.spend["month"])
    message.byok_usage = micros_to_json_number(usage.byok["all"])
    message.byok_usage_daily = micros_to_json_number(usage.byok["day"])
    message.byok_usage_weekly = micros_to_json_number(usage.byok["week"])
    message.byok_usage_monthly = micros_to_json_number(usage.byok["month"])
    message.is_free_tier = status.is_free_tier
    message.free_model_daily_requests.used = free.used
    message.free_model_daily_requests.limit = free.limit
    message.free_model_daily_requests.remaining = free.remaining
    message.budgets.extend(budget_message(layer) for layer in layers)
    message.effective_budget.CopyFrom(_effective(layers))
    return message


# GET /key's per-key members kept per process (key_fields), past it the oldest is dropped.
MAX_CACHED_FIELDS = 10_000


class KeysService(keys_pb2_grpc.KeysServicer):
    def __init__(
        self,
        auth: Authenticator,
        sessions: SessionFactory,
        clock: Clock,
        reads: HotReads | None = None,
        guardrails: GuardrailsCache | None = None,
        settlements: Settlements | None = None,
    ) -> None:
        self._auth = auth
        self._sessions = sessions
        self._clock = clock
        self._reads = reads
        # The caller's charges still committing here are waited for: GET /key shows usage
        # (none given: nothing ever commits beside an answer).
        self._settlements = settlements if settlements is not None else Settlements()
        self._guardrails = guardrails if guardrails is not None else GuardrailsCache(auth.stamp)
        # key hash -> (the cached key row they were built from, its key_fields)
        self._fields: dict[str, tuple[ApiKey, Workspace, keys_pb2.CurrentKey]] = {}

    async def GetCurrentKey(
        self, request: keys_pb2.GetCurrentKeyRequest, context: grpc.aio.ServicerContext
    ) -> keys_pb2.CurrentKeyResponse:
        return await self.current_key(metadata_of(context))

    async def current_key(
        self, metadata: Sequence[tuple[str, str | bytes]]
    ) -> keys_pb2.CurrentKeyResponse:
        """GET /key for the caller `metadata` names (its headers; the REST listener serves
        the route too). The caller and its guardrails from the process's caches; usage, the
        `:free` count and the principal stamp in one statement, read fresh every time. A
        stamp newer than the caches' means the caller changed elsewhere since it was cached:
        it is looked up again, so GET /key answers from the database's view of the key even
        inside the caches' second."""
        principal = self._auth.cached(metadata)
        if principal is not None:
            await self._settlements.settled(principal.account.id)
        now = self._clock.now()
        guardrails = (
            None
            if principal is None
            else self._guardrails.cached(principal.workspace.id, principal.key.hash)
        )
        if self._reads is not None and principal is not None and guardrails is not None:
            # The common case: no session, one statement outside any transaction.
            status, stamp = await read_key_status_and_stamp(
                self._reads, principal.key, principal.account, now
            )
            if not self._auth.stamp.observe(stamp, now):
                return self._response(status, guardrails, now, principal.workspace)
        async with self._sessions() as session:
            principal = await self._auth.authenticate(session, metadata)
            await self._settlements.settled(principal.account.id)
            now = self._clock.now()
            status, stamp = await key_status_and_stamp(
                session, principal.key, principal.account, now
            )
            if self._auth.stamp.observe(stamp, now):
                principal = await self._auth.authenticate(session, metadata)
                status, _ = await key_status_and_stamp(
                    session, principal.key, principal.account, now
                )
            guardrails = await self._guardrails.of(
                session, principal.workspace.id, principal.key.hash
            )
        return self._response(status, guardrails, now, principal.workspace)

    def _response(
        self, status: KeyStatus, guardrails: Guardrails, now: datetime, workspace: Workspace
    ) -> keys_pb2.CurrentKeyResponse:
        layers = budget_layers(guardrails.budgets, status.key, status.usage, now)
        return keys_pb2.CurrentKeyResponse(
            data=current_key_message(status, layers, self._fields_of(status.key, workspace))
        )

    def _fields_of(self, key: ApiKey, workspace: Workspace) -> keys_pb2.CurrentKey:
        """key_fields, built again whenever the principal cache holds a new row for the key
        or its workspace (it does after any change: the rows it shares are never modified)."""
        known = self._fields.get(key.hash)
        if known is not None and known[0] is key and known[1] is workspace:
            return known[2]
        fields = key_fields(key, workspace)
        if known is None and len(self._fields) >= MAX_CACHED_FIELDS:
            del self._fields[next(iter(self._fields))]
        self._fields[key.hash] = (key, workspace, fields)
        return fields
