"""Vault: the contract is complete; until their features land each rpc
authenticates the caller and answers 501 in the documented error shape."""

from __future__ import annotations

from typing import Any

import grpc

from server.auth import Authenticator
from server.contract import vault_pb2_grpc
from server.db.engine import SessionFactory
from server.errors import not_implemented
from server.services.rpc import metadata_of


def _pending(feature: str) -> Any:
    async def handler(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with self._sessions() as session:
            await self._auth.authenticate(session, metadata_of(context))
        raise not_implemented(feature)

    return handler


class _Pending:
    def __init__(self, auth: Authenticator, sessions: SessionFactory) -> None:
        self._auth = auth
        self._sessions = sessions


class PendingVaultService(_Pending, vault_pb2_grpc.VaultServicer):
    PutSecret = _pending("The vault")
    ListSecrets = _pending("The vault")
    DeleteSecret = _pending("The vault")
    PutInternSecret = _pending("The vault")
    ListInternSecrets = _pending("The vault")
    DeleteInternSecret = _pending("The vault")
    CopySecretsToIntern = _pending("The vault")
    ListEffectiveSecrets = _pending("The vault")
