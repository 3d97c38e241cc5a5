"""No key, nor any fragment of one, reaches the gateway's logs — even when the Authorization
value is malformed in ways grpc itself complains about (a byte that is not legal in an HTTP/2
header value), over gRPC directly and through Envoy."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import grpc
import pytest

from server.contract import keys_pb2, keys_pb2_grpc
from testkit.fakes.openai_stt import FakeSttProvider
from testkit.fakes.webhook_receiver import WebhookReceiver
from tests.conftest import Databases, OwnGateway, own_gateway
from tests.support.raw_http import exchange
from tests.support.signals import logged_past

FRAGMENT = 12  # any run of this many characters of the key is a leak


def _fragments(secret: str) -> set[str]:
    return {secret[i : i + FRAGMENT] for i in range(len(secret) - FRAGMENT + 1)}


def _leaks(output: str, secret: str) -> list[str]:
    return [f for f in _fragments(secret) if f in output]


async def _grpc_with_raw_byte(target: str, key: str) -> None:
    """gRPC metadata whose value ends in the raw byte 0xE9, sent as grpc sends it."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = keys_pb2_grpc.KeysStub(channel)
        for value in (f"Bearer {key}\xe9", f"Bearer {key}\udce9", f"Bearer {key}\n"):
            try:
                await stub.GetCurrentKey(
                    keys_pb2.GetCurrentKeyRequest(),
                    metadata=(("authorization", value),),
                    timeout=5,
                )
            except Exception:
                pass  # refused, here or there: what matters is what was logged


def _raw_grpc_headers(port: int, key: str) -> None:
    """An HTTP/2 gRPC call written byte by byte (no client library cleans it up): the
    authorization header value carries the raw byte 0xE9."""
    import struct

    def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
        return (
            struct.pack(">I", len(payload))[1:]
            + bytes([kind, flags])
            + struct.pack(">I", stream)
            + payload
        )

    def literal(name: bytes, value: bytes) -> bytes:
        # Literal header field without indexing, new name; lengths < 127 and < 2**14.
        def length(n: int) -> bytes:
            if n < 127:
                return bytes([n])
            n -= 127
            out = [127]
            while n >= 128:
                out.append((n % 128) + 128)
                n //= 128
            out.append(n)
            return bytes(out)

        return b"\x00" + length(len(name)) + name + length(len(value)) + value

    block = b"".join(
        literal(name, value)
        for name, value in (
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", b"/gateway.v1.Keys/GetCurrentKey"),
            (b":authority", b"127.0.0.1"),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
            (b"authorization", b"Bearer " + key.encode() + b"\xe9"),
        )
    )
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    settings = frame(0x4, 0, 0, b"")
    headers = frame(0x1, 0x4, 1, block)  # END_HEADERS
    message = frame(0x0, 0x1, 1, b"\x00\x00\x00\x00\x00")  # an empty message, END_STREAM
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(preface + settings + headers + message)
        deadline = time.monotonic() + 3
        sock.settimeout(0.5)
        while time.monotonic() < deadline:
            try:
                if not sock.recv(65536):
                    break
            except TimeoutError:
                continue
            except OSError:
                break


@pytest.fixture
async def gateway(
    databases: Databases,
    tmp_path: Path,
    fake_stt: FakeSttProvider,
    webhook_receiver: WebhookReceiver,
) -> OwnGateway:
    async with own_gateway(databases, "sqlite", tmp_path, fake_stt, webhook_receiver) as own:
        yield own


async def test_a_malformed_authorization_value_never_logs_the_key(gateway: OwnGateway) -> None:
    # An API key, and the operator key `gateway up` wrote to its data dir (only its path
    # is printed).
    operator_key = (gateway.gateway.data_dir / "operator-key").read_text().strip()
    secrets = (gateway.issued.key, operator_key)
    for key in secrets:
        await _grpc_with_raw_byte(gateway.gateway.grpc_target, key)
        await asyncio.to_thread(_raw_grpc_headers, gateway.gateway.grpc_port, key)
        for path in (b"/api/v1/key", b"/api/v1/workspaces"):
            await asyncio.to_thread(
                exchange,
                gateway.port,
                b"GET "
                + path
                + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                + key.encode()
                + b"\xe9\r\nConnection: close\r\n\r\n",
            )
    await logged_past(gateway.gateway)  # the server's lines for those calls are all in
    output = "".join(gateway.gateway.output)
    for key in secrets:
        assert _leaks(output, key) == [], output[-3000:]
    gateway.terminate()
    await gateway.exit_code(within=30)
    output = "".join(gateway.gateway.output)
    envoy_log = Path(gateway.gateway.data_dir) / "envoy" / "envoy.log"
    for key in secrets:
        assert _leaks(output, key) == [], output[-3000:]
        if envoy_log.exists():
            assert _leaks(envoy_log.read_text(errors="replace"), key) == []
