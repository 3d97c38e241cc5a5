"""Vault service: workspace and intern secrets. Responses carry metadata only."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import empty_pb2

from server.auth import Authenticator
from server.clock import Clock, rfc3339
from server.contract import vault_pb2, vault_pb2_grpc
from server.db.engine import SessionFactory
from server.db.models import VaultSecret
from server.errors import bad_request
from server.services.rpc import (
    answer_with_status,
    header_value,
    list_or_null,
    metadata_of,
    nullable_string,
)
from server.vault import store
from server.vault.access import vault_scope
from server.vault.crypto import MasterKey

AUTHORITY_HEADER = "x-gateway-authority"  # set by Envoy from :authority, never by clients


def _secret(secret: VaultSecret) -> vault_pb2.Secret:
    return vault_pb2.Secret(
        name=secret.name,
        hosts=list_or_null(secret.hosts),
        fingerprint=nullable_string(secret.fingerprint),
        created_at=rfc3339(secret.created_at),
        updated_at=rfc3339(secret.updated_at),
    )


def _page(request: vault_pb2.ListSecretsRequest) -> tuple[int, int]:
    offset = request.offset if request.HasField("offset") else 0
    limit = request.limit if request.HasField("limit") else store.PAGE_DEFAULT
    if offset < 0:
        raise bad_request("offset must be at least 0", param="offset")
    if not 1 <= limit <= store.PAGE_MAX:
        raise bad_request(f"limit must be 1 to {store.PAGE_MAX}", param="limit")
    return offset, limit


# One handler serves both routes of a pair: (service, request, context, intern_id or None).
Handler = Callable[[Any, Any, grpc.aio.ServicerContext, str | None], Awaitable[Any]]


def _route(handler: Handler, *, intern: bool) -> Callable[..., Awaitable[Any]]:
    """The RPC of one route of a pair: the workspace's secrets, or one intern's (routes under
    /interns/{intern_id}). A workspace route ignores an intern_id set in its body."""

    async def rpc(service: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await handler(service, request, context, request.intern_id if intern else None)

    return rpc


class VaultService(vault_pb2_grpc.VaultServicer):
    def __init__(
        self,
        auth: Authenticator,
        sessions: SessionFactory,
        clock: Clock,
        master: MasterKey,
        regional_hosts: frozenset[str],
    ) -> None:
        self._auth = auth
        self._sessions = sessions
        self._clock = clock
        self._master = master
        self._regional = regional_hosts

    async def _scope(
        self, session: Any, context: grpc.aio.ServicerContext, intern_id: str | None, *, write: bool
    ) -> store.Scope:
        principal = await self._auth.authenticate(session, metadata_of(context))
        return await vault_scope(
            session,
            principal,
            intern_id or None,
            authority=header_value(context, AUTHORITY_HEADER),
            regional_hosts=self._regional,
            write=write,
        )

    async def _put(
        self,
        request: vault_pb2.PutSecretRequest,
        context: grpc.aio.ServicerContext,
        intern_id: str | None,
    ) -> vault_pb2.SecretResponse:
        async with self._sessions() as session:
            scope = await self._scope(session, context, intern_id, write=True)
            name = store.check_name(request.name)
            value = store.check_value(request.value)
            hosts = store.check_hosts(list(request.hosts))
            secret = await store.put_secret(
                session, self._master, scope, name, value, hosts, self._clock.now()
            )
            await session.commit()
        return vault_pb2.SecretResponse(data=_secret(secret))

    async def _list(
        self,
        request: vault_pb2.ListSecretsRequest,
        context: grpc.aio.ServicerContext,
        intern_id: str | None,
    ) -> vault_pb2.SecretListResponse:
        async with self._sessions() as session:
            scope = await self._scope(session, context, intern_id, write=False)
            offset, limit = _page(request)
            rows, more = await store.list_secrets(session, scope, offset, limit)
        return vault_pb2.SecretListResponse(data=[_secret(r) for r in rows], has_more=more)

    async def _get(
        self,
        request: vault_pb2.GetSecretRequest,
        context: grpc.aio.ServicerContext,
        intern_id: str | None,
    ) -> vault_pb2.SecretResponse:
        async with self._sessions() as session:
            scope = await self._scope(session, context, intern_id, write=False)
            secret = await store.get_secret(session, scope, request.name)
        return vault_pb2.SecretResponse(data=_secret(secret))

    async def _delete(
        self,
        request: vault_pb2.DeleteSecretRequest,
        context: grpc.aio.ServicerContext,
        intern_id: str | None,
    ) -> empty_pb2.Empty:
        async with self._sessions() as session:
            scope = await self._scope(session, context, intern_id, write=True)
            store.check_name(request.name)
            await store.delete_secret(session, scope, request.name)
            await session.commit()
        await answer_with_status(context, 204)
        return empty_pb2.Empty()

    PutSecret = _route(_put, intern=False)
    PutInternSecret = _route(_put, intern=True)
    ListSecrets = _route(_list, intern=False)
    ListInternSecrets = _route(_list, intern=True)
    GetSecret = _route(_get, intern=False)
    GetInternSecret = _route(_get, intern=True)
    DeleteSecret = _route(_delete, intern=False)
    DeleteInternSecret = _route(_delete, intern=True)

    async def CopySecretsToIntern(
        self, request: vault_pb2.CopySecretsRequest, context: grpc.aio.ServicerContext
    ) -> vault_pb2.SecretCopyResponse:
        async with self._sessions() as session:
            scope = await self._scope(session, context, request.intern_id, write=True)
            assert scope.intern is not None
            copied = await store.copy_to_intern(
                session,
                self._master,
                scope.workspace,
                scope.intern,
                list(request.names),
                self._clock.now(),
            )
            await session.commit()
        return vault_pb2.SecretCopyResponse(data=[_secret(s) for s in copied])

    async def ListEffectiveSecrets(
        self, request: vault_pb2.ListSecretsRequest, context: grpc.aio.ServicerContext
    ) -> vault_pb2.EffectiveSecretListResponse:
        async with self._sessions() as session:
            scope = await self._scope(session, context, request.intern_id, write=False)
            offset, limit = _page(request)
            rows = await store.effective_secrets(session, scope)
        page = rows[offset : offset + limit]
        data = []
        for secret, kind in page:
            message = _secret(secret)
            data.append(
                vault_pb2.EffectiveSecret(
                    name=message.name,
                    hosts=message.hosts,
                    fingerprint=message.fingerprint,
                    created_at=message.created_at,
                    updated_at=message.updated_at,
                    scope=kind,
                )
            )
        return vault_pb2.EffectiveSecretListResponse(data=data, has_more=len(rows) > offset + limit)
