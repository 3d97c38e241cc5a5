"""Console service: GET /console/{path} — the web console's static files (server/console)."""

from __future__ import annotations

import grpc
from google.api import httpbody_pb2

from server.console import ConsoleAssets
from server.contract import console_pb2, console_pb2_grpc


class ConsoleService(console_pb2_grpc.ConsoleServicer):
    def __init__(self, assets: ConsoleAssets) -> None:
        self._assets = assets

    async def GetConsoleAsset(
        self, request: console_pb2.GetConsoleAssetRequest, context: grpc.aio.ServicerContext
    ) -> httpbody_pb2.HttpBody:
        asset = self._assets.get(request.path)
        # Envoy passes these on as response headers.
        await context.send_initial_metadata(asset.headers())
        return httpbody_pb2.HttpBody(content_type=asset.content_type, data=asset.data)
