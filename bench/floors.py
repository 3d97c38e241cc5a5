"""The floors of issue 17: what the stack itself costs, with none of the gateway's logic.

- F1: Envoy (the gateway's own config, rendered by facade/ with the descriptor set of
  server/contract.py: JSON transcoder, Lua, local replies, edge filters) in front of a bare
  grpc.aio server whose gateway.v1.Keys/GetCurrentKey answers a fixed GET /key-shaped response.
- F2: the same stack, plus gateway.v1.Audio/Transcribe passing the request's body (the
  multipart upload as it arrived) to the fake provider with one `httpx` call and returning
  its answer: no database, no auth, no admission, no decode, no ledger.

One process serves both (the servicers are registered together; F1 only ever calls Keys,
F2 only Audio), started by bench.hotpath as `python -m bench.floors --provider-url URL
--provider-key KEY`; it prints `Floor listening on 127.0.0.1:PORT` when Envoy is ready and
stops on SIGTERM. Only 127.0.0.1 is contacted.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import grpc
import httpx
from google.api import httpbody_pb2
from google.protobuf import struct_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from bench.harness.load import LOOPBACK, REQUEST_TIMEOUT
from bench.harness.processes import UNCAPPED_EDGE
from facade.envoy_config import EnvoyOptions, Upstream
from facade.launcher import EnvoyProcess
from server.config import EdgePolicy
from server.contract import DESCRIPTOR_SET, SERVICES, audio_pb2_grpc, keys_pb2, keys_pb2_grpc
from tests.support.processes import free_port

FLOOR_READY = "Floor listening on"


def fixed_key_response() -> keys_pb2.CurrentKeyResponse:
    """A GET /key-shaped answer, built once: the members a real key's answer carries."""
    null = struct_pb2.Value(null_value=struct_pb2.NULL_VALUE)
    key = keys_pb2.CurrentKey(
        label="sk-or-v1-abc...xyz",
        limit=null,
        limit_reset=null,
        limit_remaining=null,
        usage=0.0,
        is_free_tier=False,
        free_model_daily_requests=keys_pb2.FreeModelDailyRequests(
            used=0, limit=1000, remaining=1000
        ),
        workspace_id=struct_pb2.Value(string_value="ws_default"),
    )
    return keys_pb2.CurrentKeyResponse(data=key)


class FixedKeys(keys_pb2_grpc.KeysServicer):
    def __init__(self) -> None:
        self._response = fixed_key_response()

    async def GetCurrentKey(
        self, request: keys_pb2.GetCurrentKeyRequest, context: grpc.aio.ServicerContext
    ) -> keys_pb2.CurrentKeyResponse:
        return self._response


class PassThroughAudio(audio_pb2_grpc.AudioServicer):
    """The request's body to the provider, the provider's answer back: one httpx call."""

    def __init__(self, http: httpx.AsyncClient, provider_url: str, provider_key: str) -> None:
        self._http = http
        self._url = provider_url.rstrip("/") + "/audio/transcriptions"
        self._authorization = f"Bearer {provider_key}"

    async def Transcribe(
        self, request: httpbody_pb2.HttpBody, context: grpc.aio.ServicerContext
    ) -> httpbody_pb2.HttpBody:
        response = await self._http.post(
            self._url,
            content=request.data,
            headers={
                "Authorization": self._authorization,
                "Content-Type": request.content_type,
            },
        )
        return httpbody_pb2.HttpBody(content_type="application/json", data=response.content)


async def serve(provider_url: str, provider_key: str, http_port: int, work_dir: Path) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    grpc_port = free_port()
    server = grpc.aio.server()
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT, trust_env=False) as http:
        keys_pb2_grpc.add_KeysServicer_to_server(FixedKeys(), server)
        audio_pb2_grpc.add_AudioServicer_to_server(
            PassThroughAudio(http, provider_url, provider_key), server
        )
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        server.add_insecure_port(f"{LOOPBACK}:{grpc_port}")
        await server.start()
        envoy = EnvoyProcess(
            EnvoyOptions(
                descriptor_path=str(DESCRIPTOR_SET),
                services=SERVICES,
                upstreams=(Upstream(LOOPBACK, grpc_port),),
                listen_host=LOOPBACK,
                listen_port=http_port,
                # As the gateway's in the benches: the one load generator is not rate-limited
                # (otherwise the floor's 429s, cheap answers, count as served requests).
                edge=EdgePolicy.model_validate(UNCAPPED_EDGE),
            ),
            work_dir,
        )
        await envoy.start()
        try:
            print(f"{FLOOR_READY} {LOOPBACK}:{http_port}", flush=True)
            await stop.wait()
        finally:
            await envoy.stop()
            await server.stop(1.0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.floors", description=__doc__)
    parser.add_argument("--provider-url", required=True, help="the fake provider's …/v1 URL")
    parser.add_argument("--provider-key", required=True)
    parser.add_argument("--http-port", type=int, default=0, help="Envoy's port (0: a free one)")
    args = parser.parse_args(argv)
    if not args.provider_url.startswith(f"http://{LOOPBACK}:"):
        parser.error(f"--provider-url must be on {LOOPBACK}")
    http_port = args.http_port or free_port()
    with tempfile.TemporaryDirectory(prefix="bench-floor-") as tmp:
        asyncio.run(serve(args.provider_url, args.provider_key, http_port, Path(tmp)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
