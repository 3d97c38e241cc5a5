"""Odd inputs at the edge, sent byte for byte (ordinary clients refuse to send most of them):
every one is answered at once, in the documented error shape, never with a 5xx."""

from __future__ import annotations

import asyncio
import json

import pytest

from testkit.admin import IssuedKey
from tests.conftest import Stack
from tests.support.raw_http import RawResponse, exchange
from tests.support.signals import logged_past


def request_bytes(
    method: str, target: str, headers: dict[str, str] | list[tuple[str, str]], body: bytes = b""
) -> bytes:
    items = list(headers.items()) if isinstance(headers, dict) else list(headers)
    lines = [f"{method} {target} HTTP/1.1", "Host: gateway"]
    lines += [f"{name}: {value}" for name, value in items]
    if body or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


async def send(
    stack: Stack,
    method: str,
    target: str,
    headers: dict[str, str] | list[tuple[str, str]],
    body: bytes = b"",
) -> RawResponse:
    raw = request_bytes(method, target, headers, body)
    return await asyncio.to_thread(exchange, stack.gateway.http_port, raw, timeout=20)


def assert_shape(response: RawResponse, status: int) -> dict[str, object]:
    assert response.status == status, (response.status, response.body[:500])
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == status
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert set(body["error"]) <= {"code", "message", "metadata"}
    return body["error"]  # type: ignore[no-any-return]


# --- headers the server does not use never reach it ----------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("X|Y", "1"),
        *((f"X{c}Y", "1") for c in "!#$%&'*+^~"),
        ("x-foo-bin", "!!!"),
        ("grpc-timeout", "zzz"),
        ("grpc-encoding", "bogus"),
        ("grpc-accept-encoding", "bogus"),
        ("te", "gzip"),
        ("x-envoy-expected-rq-timeout-ms", "zzz"),
    ],
)
async def test_headers_grpc_refuses_are_not_forwarded(
    stack: Stack, funded: IssuedKey, name: str, value: str
) -> None:
    headers = [*funded.headers.items(), (name, value)]
    answer = await send(stack, "GET", "/api/v1/key", headers)
    assert answer.status == 200, answer.body[:300]
    posted = await send(
        stack,
        "POST",
        "/api/v1/videos",
        [*headers, ("Content-Type", "application/json")],
        json.dumps({"model": "fakevideo/frames", "prompt": "x", "duration": 99}).encode(),
    )
    assert_shape(posted, 400)


async def test_grpc_paths_are_not_public(stack: Stack, funded: IssuedKey) -> None:
    """gRPC callers use the server's port; through the REST edge a gRPC path is unknown."""
    for content_type in ("application/grpc", "application/json"):
        answer = await send(
            stack,
            "POST",
            "/gateway.v1.Keys/GetKey",
            {**funded.headers, "Content-Type": content_type},
            b"\x00\x00\x00\x00\x00",
        )
        assert_shape(answer, 404)


# --- upgrades ------------------------------------------------------------------------------------


async def test_a_websocket_upgrade_is_refused_at_once(stack: Stack, funded: IssuedKey) -> None:
    headers = {
        **funded.headers,
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
    }
    answer = await send(stack, "GET", "/api/v1/key", headers)
    assert answer.seconds < 2
    assert assert_shape(answer, 400)["message"] == (
        "Protocol upgrades (WebSocket) are not supported"
    )
    connect = await send(stack, "CONNECT", "gateway:443", funded.headers)
    assert connect.seconds < 2
    assert_shape(connect, 404)


# --- path parameters, deep JSON, huge numbers ----------------------------------------------------


@pytest.mark.parametrize("job_id", ["%C3", "%ff%fe", "%C0%AF", "ok%C3"])
async def test_bad_percent_encoding_in_a_path_parameter(
    stack: Stack, funded: IssuedKey, job_id: str
) -> None:
    for target in (f"/api/v1/videos/{job_id}", f"/api/v1/videos/{job_id}/content?index=0"):
        answer = await send(stack, "GET", target, funded.headers)
        assert_shape(answer, 400)


DEEP = b"[" * 50_000 + b"]" * 50_000
HUGE = b"9" * 5_000


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/v1/audio/transcriptions", DEEP),
        ("/api/v1/audio/transcriptions", b'{"model": "fake/ok", "x": ' + DEEP + b"}"),
        ("/api/v1/audio/transcriptions", b'{"model": "fake/ok", "temperature": ' + HUGE + b"}"),
        ("/api/v1/videos", DEEP),
        ("/api/v1/videos", b'{"model": "fakevideo/frames", "trace": {"a": ' + DEEP + b"}}"),
        ("/api/v1/videos", b'{"model": "fakevideo/frames", "seed": ' + HUGE + b"}"),
    ],
)
async def test_deep_json_and_huge_numbers_are_400(
    stack: Stack, funded: IssuedKey, path: str, body: bytes
) -> None:
    headers = {**funded.headers, "Content-Type": "application/json"}
    answer = await send(stack, "POST", path, headers, body)
    assert_shape(answer, 400)


@pytest.mark.parametrize(
    ("path", "rest"),
    [
        ("/api/v1/videos", {"prompt": "a tree", "duration": 1}),
        ("/api/v1/audio/transcriptions", {"input_audio": {"data": "AAAA", "format": "wav"}}),
    ],
)
async def test_a_30000_character_model_is_a_bounded_400(
    stack: Stack, funded: IssuedKey, path: str, rest: dict[str, object]
) -> None:
    headers = {**funded.headers, "Content-Type": "application/json"}
    for model in ("a/" + "m" * 30_000, "m" * 30_000, "a/" + "é" * 30_000):
        body = json.dumps({"model": model, **rest}).encode()
        answer = await send(stack, "POST", path, headers, body)
        error = assert_shape(answer, 400)
        assert len(str(error["message"])) <= 500
        assert len(answer.body) < 4_000  # 500 characters, \u-escaped at worst


def test_errors_bound_what_they_echo() -> None:
    from server.errors import GatewayError, bad_request

    error = bad_request(f"Unknown model {'x' * 30_000!r}", param="model", value="v" * 30_000)
    assert len(error.message) == 500 and error.message.endswith("...")
    assert error.metadata is not None and len(error.metadata["value"]) == 200
    assert len(error.body_json()) < 1_000
    many = GatewayError(400, "bad", {"items": list(range(10_000))})
    assert len(many.body_json()) < 1_000
    nested = GatewayError(
        400, "\u4e00" * 30_000, {"param": "model", "deep": [["\u00e9" * 500] * 50] * 50}
    )
    assert nested.metadata == {"param": "model"}
    assert len(nested.body_json()) < 4_000  # 500 characters, \u-escaped at worst
    from server.services.rpc import status_details

    assert len(status_details(nested)) < 4_000


# --- the transcoder's 400s never quote the request -----------------------------------------------


@pytest.mark.parametrize(
    ("method", "target", "body", "expected"),
    [
        (
            "PUT",
            "/api/v1/vault/secrets/x",
            b'{"value": s3cr3t-no-quotes, "hosts": ["api.example.com"]}',
            {"code": 400, "message": "Request body is not valid JSON"},
        ),
        (
            "PUT",
            "/api/v1/vault/secrets/x",
            b'{"value": "a", "hosts": s3cr3t-no-quotes}',
            {"code": 400, "message": "Request body is not valid JSON"},
        ),
        (
            "PUT",
            "/api/v1/vault/secrets/x",
            b'{"value": 5303r3t, "hosts": ["api.example.com"]}',
            {"code": 400, "message": "Request body is not valid JSON"},
        ),
        (
            "PUT",
            "/api/v1/vault/secrets/x",
            b'{"value": 53035303, "hosts": ["api.example.com"]}',
            {"code": 400, "message": "Invalid value for value", "metadata": {"param": "value"}},
        ),
        (
            "PUT",
            "/api/v1/vault/secrets/x",
            b'{"value": {"s3cr3t": 1}, "hosts": ["api.example.com"]}',
            {"code": 400, "message": "Request body is not valid JSON"},
        ),
        (
            "POST",
            "/api/v1/videos",
            b'{"model": "fakevideo/frames", "seed": ' + HUGE + b"}",
            {"code": 400, "message": "Request body is not valid JSON"},
        ),
        (
            "GET",
            "/api/v1/videos/job/content?index=s3cr3t",
            b"",
            {"code": 400, "message": "Invalid value for index", "metadata": {"param": "index"}},
        ),
        (
            "GET",
            "/api/v1/videos/job/content?index=1&index=2",
            b"",
            {"code": 400, "message": "Invalid query parameters"},
        ),
    ],
)
async def test_transcoder_errors_never_quote_the_request(
    stack: Stack, unique: str, method: str, target: str, body: bytes, expected: dict[str, object]
) -> None:
    workspace = await stack.admin.workspace(f"quote-{unique}", intern_programme=True)
    key = await stack.admin.key(workspace)
    headers = {**key.headers, "Content-Type": "application/json"}
    answer = await send(stack, method, target, headers, body)
    assert assert_shape(answer, 400) == expected
    assert b"s3cr3t" not in answer.body and b"5303" not in answer.body
    assert not any(h.startswith("x-gateway-") for h in answer.headers)


# --- the header limit: one number, the same every time -------------------------------------------

HEADER_LIMIT = 60 * 1024  # docs/operating.md, "headers": 60 KiB (EdgePolicy.max_request_headers_kb)


def headers_of_size(total: int, authorization: dict[str, str]) -> list[tuple[str, str]]:
    """Headers whose names and values add up to `total` bytes: some the server reads and must
    accept (a long host, forwarded again as x-gateway-authority, and tracestate), the rest
    padding the edge drops."""
    headers = [*authorization.items(), ("tracestate", "a=" + "b" * 20_000)]
    host = "h" * 8_000 + ".example.com"
    used = sum(len(n) + len(v) for n, v in headers) + len("host") + len(host)
    index = 0
    while used < total:
        name = f"x-pad-{index}"
        value = "p" * min(4_000, total - used - len(name))
        headers.append((name, value))
        used += len(name) + len(value)
        index += 1
    return [("Host", host), *headers]


async def test_headers_just_under_the_limit_pass_and_just_over_are_413_every_time(
    stack: Stack, funded: IssuedKey
) -> None:
    port = stack.gateway.http_port

    def one(total: int) -> RawResponse:
        lines = ["GET /api/v1/key HTTP/1.1"]
        lines += [f"{n}: {v}" for n, v in headers_of_size(total, funded.headers)]
        return exchange(port, ("\r\n".join(lines) + "\r\n\r\n").encode(), timeout=20)

    for _ in range(20):
        under = await asyncio.to_thread(one, HEADER_LIMIT - 1024)
        assert under.status == 200, under.body[:300]
        over = await asyncio.to_thread(one, HEADER_LIMIT + 1024)
        assert assert_shape(over, 413)["message"] == "Request headers too large"


# --- requests Envoy cannot parse -----------------------------------------------------------------


@pytest.mark.parametrize(
    "head",
    [
        # no Host in HTTP/1.1
        "GET /api/v1/key HTTP/1.1\r\n",
        # a fragment in the request target
        "GET /api/v1/key#part HTTP/1.1\r\nHost: gateway\r\n",
        # Transfer-Encoding and Content-Length together (request smuggling)
        "POST /api/v1/videos HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
        "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
        # a Transfer-Encoding other than chunked (Envoy: 501, not a documented status)
        "POST /api/v1/videos HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: gzip, chunked\r\n",
        # two different Content-Lengths
        "POST /api/v1/videos HTTP/1.1\r\nHost: gateway\r\nContent-Length: 2\r\n"
        "Content-Length: 3\r\n",
    ],
)
async def test_unparsable_requests_are_400_with_a_message(stack: Stack, head: str) -> None:
    raw = head.encode() + b"\r\n" + (b"2\r\n{}\r\n0\r\n\r\n" if "chunked" in head else b"")
    answer = await asyncio.to_thread(exchange, stack.gateway.http_port, raw, timeout=20)
    assert answer.seconds < 2
    assert_shape(answer, 400)


# --- header values gRPC refuses ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["Authorization", "X-Session-Id", "traceparent", "Origin"])
async def test_a_header_value_that_is_not_printable_ascii_is_400_and_never_logged(
    stack: Stack, funded: IssuedKey, name: str
) -> None:
    """gRPC logs a metadata value it cannot decode (an API key with a stray byte, in full)
    before refusing the call: such values are refused at the edge."""
    secret = funded.headers["Authorization"] + "-l0gged"
    value = (secret if name == "Authorization" else "caf\u00e9-l0gged") + "\u00ff"
    headers = {**funded.headers, name: value}
    answer = await send(stack, "GET", "/api/v1/key", headers)
    error = assert_shape(answer, 400)
    assert error == {"code": 400, "message": f"Header {name.lower()} must be printable ASCII"}
    await logged_past(stack.gateway)  # what the server logged for that call is in
    assert "l0gged" not in stack.gateway.log()


# --- HTTP/2 request trailers ---------------------------------------------------------------------


async def test_http2_request_trailers_never_reach_the_server(
    stack: Stack, funded: IssuedKey
) -> None:
    from tests.support.raw_h2 import h2_exchange

    headers = [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":authority", b"gateway"),
        (b":path", b"/api/v1/videos"),
        (b"authorization", funded.headers["Authorization"].encode()),
        (b"content-type", b"application/json"),
    ]
    body = json.dumps({"model": "fakevideo/frames", "prompt": "x", "duration": 99}).encode()
    for trailer in ((b"grpc-timeout", b"zzz"), (b"x!y", b"1"), (b"x-a-bin", b"!!!")):
        status, answer = await asyncio.to_thread(
            h2_exchange, stack.gateway.http_port, headers, body, [trailer]
        )
        assert status == 400, answer[:300]
        assert json.loads(answer)["error"]["metadata"] == {"param": "duration"}
