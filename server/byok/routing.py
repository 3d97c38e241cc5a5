"""The endpoints a request tries once a workspace's own keys join the operator's: per
provider slug, the workspace's prioritized keys first (in `sort_order`), then the operator's
endpoints, then the workspace's fallback keys. A key marked "always use" (`is_required` for
the models it applies to, `is_byok_only` for every model of its provider) removes the
operator's endpoints of that provider: when the keys fail, the request fails."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TypedDict, Unpack

from sqlmodel.ext.asyncio.session import AsyncSession

from server.byok import keys as store
from server.byok.cache import ByokKeysCache, SealedKeys, load
from server.byok.fees import ByokFees, count_byok_request
from server.db.models import ByokKey
from server.errors import GatewayError
from server.providers.endpoint import Endpoint
from server.routing.catalog import LOCAL_ADAPTERS
from server.vault import crypto
from server.vault.store import data_key


@dataclass(frozen=True)
class UsableKey:
    """An enabled key with what it opens to; `secret` only for two-key providers."""

    row: ByokKey
    plaintext: str = field(repr=False)

    def applies_to(self, model_id: str | None, key_hash: str, user: str | None) -> bool:
        """Whether this request may use the key (`model_id` None: whatever the model)."""
        row = self.row
        return (
            (model_id is None or row.allowed_models is None or model_id in row.allowed_models)
            and (row.allowed_api_key_hashes is None or key_hash in row.allowed_api_key_hashes)
            and (row.allowed_user_ids is None or user in row.allowed_user_ids)
        )


def with_key(endpoint: Endpoint, key: UsableKey) -> Endpoint | None:
    """The endpoint with the workspace's key in place of the operator's credential, or None
    when the key does not fit the endpoint (a two-key provider needs both)."""
    if endpoint.secret_key_env is None:
        return replace(endpoint, byok_credential=key.plaintext)
    try:
        parsed = json.loads(key.plaintext)
        return replace(
            endpoint, byok_credential=parsed["access_key"], byok_secret=parsed["secret_key"]
        )
    except (ValueError, KeyError, TypeError):
        return None


@dataclass(frozen=True)
class PlannedAttempt:
    index: int  # the endpoint's position in the model's endpoints
    endpoint: Endpoint  # with the workspace's key substituted when key_id is set
    key_id: str | None  # the workspace's key used, or None: the operator's credential


def plan_attempts(
    endpoints: Sequence[Endpoint],
    usable: Sequence[UsableKey],
    *,
    model_id: str,
    key_hash: str,
    user: str | None = None,
) -> list[PlannedAttempt]:
    """The attempts to make, in order. `endpoints` are the model's (after guardrails),
    `usable` the workspace's enabled keys in their order."""
    applying = [k for k in usable if k.applies_to(model_id, key_hash, user)]
    always_use = {k.row.provider for k in applying if k.row.is_required} | {
        # is_byok_only takes the operator's endpoints away for every model of the provider
        k.row.provider
        for k in usable
        if k.row.is_byok_only and k.applies_to(None, key_hash, user)
    }

    def keyed(fallback: bool) -> list[PlannedAttempt]:
        tried: list[PlannedAttempt] = []
        for index, endpoint in enumerate(endpoints):
            if endpoint.adapter in LOCAL_ADAPTERS:
                continue
            for key in applying:
                if key.row.provider == endpoint.provider and key.row.is_fallback == fallback:
                    substituted = with_key(endpoint, key)
                    if substituted is not None:
                        tried.append(PlannedAttempt(index, substituted, key.row.id))
        return tried

    operator = [
        PlannedAttempt(index, endpoint, None)
        for index, endpoint in enumerate(endpoints)
        if endpoint.provider not in always_use
    ]
    return [*keyed(fallback=False), *operator, *keyed(fallback=True)]


def plan(
    endpoints: Sequence[Endpoint],
    usable: Sequence[UsableKey],
    *,
    model_id: str,
    key_hash: str,
    user: str | None = None,
) -> list[Endpoint]:
    """The endpoints to try, in order (see plan_attempts)."""
    attempts = plan_attempts(endpoints, usable, model_id=model_id, key_hash=key_hash, user=user)
    return [a.endpoint for a in attempts]


@dataclass(frozen=True)
class BillingPlan:
    """What to hold before the endpoints of a plan are tried, when it is not yet known
    which one serves: the operator's charges the provider cost to the credits, a BYOK key
    only the platform fee (never more than the cost) and the cost to the BYOK counters."""

    credit_hold: int  # against the balance and the key's limit
    byok_hold: bool  # also hold the provider cost as BYOK (the key's limit, if it says so)
    only_byok: bool  # every attempt uses the workspace's keys


def billing_plan(endpoints: Sequence[Endpoint], cost: int, fees: ByokFees | None) -> BillingPlan:
    byok = operator = False
    for endpoint in endpoints:
        if endpoint.available:
            if endpoint.is_byok:
                byok = True
            else:
                operator = True
    if not byok or fees is None:
        return BillingPlan(credit_hold=cost, byok_hold=False, only_byok=False)
    return BillingPlan(
        credit_hold=cost if operator else fees.fee(cost),
        byok_hold=cost > 0,
        only_byok=not operator,
    )


class KeyedRequest(TypedDict):
    """The request a plan is made for (ByokRouting.attempts / endpoints)."""

    workspace_id: str
    key_hash: str
    model_id: str
    endpoints: Sequence[Endpoint]  # the model's, after guardrails
    user: str | None
    now: datetime


class ByokRouting:
    """Loads a workspace's keys and opens them for one request; prices the platform fee.
    With `keys`, the sealed keys come from the process's cache (server/byok/cache.py)."""

    def __init__(
        self, master: crypto.MasterKey, fees: ByokFees, keys: ByokKeysCache | None = None
    ) -> None:
        self._master = master
        self.fees = fees
        self._keys = keys

    def cached(self, workspace_id: str) -> SealedKeys | None:
        """The workspace's sealed keys without any database work, when the cache has them
        and the stamp needs no read; None: a session is needed (`sealed`)."""
        return None if self._keys is None else self._keys.cached(workspace_id)

    async def sealed(self, session: AsyncSession, workspace_id: str) -> SealedKeys:
        return (
            await self._keys.of(session, workspace_id)
            if self._keys is not None
            else await load(session, workspace_id)
        )

    def open(self, sealed: SealedKeys) -> list[UsableKey]:
        """The keys opened for one request (decrypted now, kept by no cache)."""
        if not sealed.rows:
            return []
        if sealed.wrapped_key is None or sealed.master_key_id != self._master.key_id:
            raise GatewayError(500, "Internal server error")  # data key gone, or wrong master
        opening = self._master.unwrap(sealed.wrapped_key)
        return [UsableKey(row, store.open_key(self._master, row, opening)) for row in sealed.rows]

    def planned(self, sealed: SealedKeys, **request: Unpack[KeyedRequest]) -> list[Endpoint]:
        """The endpoints to try, in order, with these keys (see attempts)."""
        if not sealed.rows:  # no keys (most workspaces): the plan is the endpoints as given
            return list(request["endpoints"])
        attempts = plan_attempts(
            request["endpoints"],
            self.open(sealed),
            model_id=request["model_id"],
            key_hash=request["key_hash"],
            user=request["user"],
        )
        return [attempt.endpoint for attempt in attempts]

    async def fee_for(
        self, session: AsyncSession, account_id: str, cost_micros: int, now: datetime
    ) -> int:
        """Count one BYOK request of the account this month; the fee it pays. Part of the
        caller's settlement transaction."""
        request_of_month = await count_byok_request(session, account_id, now)
        return self.fees.charged(cost_micros, request_of_month)

    async def usable_keys(
        self, session: AsyncSession, workspace_id: str, now: datetime
    ) -> list[UsableKey]:
        del now  # the data key exists since the keys were sealed: nothing is created here
        return self.open(await self.sealed(session, workspace_id))

    async def key_endpoint(
        self, session: AsyncSession, endpoint: Endpoint, key_id: str, now: datetime
    ) -> Endpoint | None:
        """`endpoint` with one of the workspace's keys (a job polling where it was
        submitted), or None when that key is gone or no longer fits."""
        row = await session.get(ByokKey, key_id)
        if row is None:
            return None
        opening = await data_key(session, self._master, store.vault_id(row.workspace_id), now)
        return with_key(endpoint, UsableKey(row, store.open_key(self._master, row, opening)))

    async def attempts(
        self, session: AsyncSession, **request: Unpack[KeyedRequest]
    ) -> list[PlannedAttempt]:
        usable = await self.usable_keys(session, request["workspace_id"], request["now"])
        return plan_attempts(
            request["endpoints"],
            usable,
            model_id=request["model_id"],
            key_hash=request["key_hash"],
            user=request["user"],
        )

    async def endpoints(
        self, session: AsyncSession, **request: Unpack[KeyedRequest]
    ) -> list[Endpoint]:
        """The endpoints to try, in order (see attempts)."""
        return self.planned(await self.sealed(session, request["workspace_id"]), **request)
