"""The pooled client's transport (server/providers/transport.py: the gateway's HTTP/1.1 pool,
answers parsed by llhttp) behaves as httpx's own transport (httpcore + h11) does: every test
runs against both and expects the same answers and the same httpx exception types — which
server/providers/http.py's `send` turns into the gateway's failures — with TLS verified by the
configured context, keep-alive, limits, timeouts, cancellation, every framing of an answer,
and requests that could be split refused."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import gzip
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest
import trustme

from server.providers.endpoint import Endpoint
from server.providers.failures import TIMEOUT, UNREACHABLE, ProviderFailure
from server.providers.http import call, no_cookies, provider_client
from server.providers.transport import Http11Transport, _Connection

LOOPBACK = "127.0.0.1"
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes] | None:
    """One request's head and body (Content-Length or chunked); None at end of stream."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lowered = head.lower()
    if b"transfer-encoding: chunked" in lowered:
        body = b""
        while True:
            size = int((await reader.readline()).strip(), 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                return head, body
            body += chunk[:-2]
    length = 0
    for line in lowered.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head, await reader.readexactly(length)


def answer(body: bytes, *, close: bool = False) -> bytes:
    connection = b"Connection: close\r\n" if close else b""
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + connection
        + b"Content-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


class Server:
    """A loopback HTTP/1.1 server whose per-connection behaviour each test chooses; it
    counts the connections it accepted."""

    def __init__(self, handler: Handler, tls: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.tls = tls
        self.connections = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            writer.close()
            self._tasks.discard(task)

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._serve, LOOPBACK, 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def close_connections(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def url(self, path: str = "/v1/audio/transcriptions", scheme: str = "http") -> str:
        return f"{scheme}://{LOOPBACK}:{self.port}{path}"


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers each request on the connection with its body."""
    while (request := await read_request(reader)) is not None:
        writer.write(answer(request[1]))
        await writer.drain()


async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    await asyncio.sleep(3600)


@pytest.fixture(params=["httpx", "http11"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@contextlib.asynccontextmanager
async def client_of(
    kind: str,
    tls: ssl.SSLContext | None = None,
    limits: httpx.Limits | None = None,
    seconds: float = 5.0,
) -> AsyncIterator[httpx.AsyncClient]:
    """The pooled client as build_core makes it ("http11": `provider_client`), or the same
    settings on httpx's own client and transport."""
    tls = tls or ssl.create_default_context()
    limits = limits or httpx.Limits(max_connections=256, max_keepalive_connections=64)
    if kind == "http11":
        client = provider_client(tls, limits=limits, timeout=seconds)
    else:
        client = httpx.AsyncClient(
            verify=tls,
            timeout=seconds,
            limits=limits,
            follow_redirects=False,
            cookies=no_cookies(),
        )
    async with client:
        yield client


async def test_requests_share_one_kept_alive_connection(kind: str) -> None:
    async with Server(echo) as server, client_of(kind) as client:
        for index in range(3):
            response = await client.post(server.url(), content=b"x" * (index * 40_000))
            assert response.content == b"x" * (index * 40_000)
        assert server.connections == 1


async def test_a_provider_call_leaves_nothing_for_the_garbage_collector() -> None:
    """A provider call whose answer arrives whole (a transcription's: 32 KB up, a little
    JSON back) frees everything of the transport's by reference counting: no cycle keeps the
    answer, its request or the uploaded body for the collector (the llhttp parser and its
    answer held each other: 22 objects and the body a call). httpx's client adds a cycle of
    its own per call (a Response and the BoundAsyncStream around its stream), so the
    transport is called directly, as the client calls it."""

    async def small_answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await read_request(reader) is not None:
            writer.write(answer(b'{"text": "ok"}'))
            await writer.drain()

    transport = Http11Transport(ssl.create_default_context(), httpx.Limits(max_connections=4))
    async with Server(small_answers) as server, transport:

        async def call(content: bytes) -> bytes:
            request = httpx.Request("POST", server.url(), content=content)
            response = await transport.handle_async_request(request)
            try:
                return await response.aread()
            finally:
                await response.aclose()

        await call(b"warm")
        gc.collect()
        gc.disable()
        try:
            for _ in range(3):
                assert await call(b"x" * 32 * 1024) == b'{"text": "ok"}'
            assert gc.collect() == 0
        finally:
            gc.enable()


@pytest.mark.parametrize("transport", ["gateway", "httpx"])
async def test_the_provider_transport_setting_picks_the_transport_under_one_client(
    transport: str,
) -> None:
    """GATEWAY_PROVIDER_TRANSPORT (provider_client's `transport`): the same client, the
    gateway's transport or httpx's own under it; a name it does not know is refused."""
    async with Server(echo) as server:
        client = provider_client(ssl.create_default_context(), transport=transport)
        async with client:
            response = await client.post(server.url(), content=b"ping")
            assert response.content == b"ping"
            assert response.status_code == 200
    with pytest.raises(ValueError, match="unknown provider transport"):
        provider_client(ssl.create_default_context(), transport="curl")


async def test_a_large_streamed_body_both_ways(kind: str) -> None:
    """Beyond every buffer: the upload in chunks (chunked encoding), the answer read in
    pieces while reading pauses and resumes."""
    body = bytes(range(256)) * 16 * 1024  # 4 MiB

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 300_000):
            yield body[start : start + 300_000]

    async with Server(echo) as server, client_of(kind) as client:
        response = await client.post(server.url(), content=chunks())
        assert response.content == body
        streamed = bytearray()
        async with client.stream("POST", server.url(), content=body) as response:
            async for part in response.aiter_raw():
                streamed += part
                await asyncio.sleep(0)
        assert streamed == body


async def test_a_connection_the_server_closed_is_replaced(kind: str) -> None:
    async def one_per_connection(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await read_request(reader)
        writer.write(answer(b"{}"))  # keep-alive claimed, then closed while idle
        await writer.drain()

    async with Server(one_per_connection) as server, client_of(kind) as client:
        for _ in range(3):
            assert (await client.post(server.url(), content=b"a")).status_code == 200
            await asyncio.sleep(0.05)  # the close arrives while the connection is idle
        assert server.connections == 3


async def test_tls_is_verified_with_the_configured_context(kind: str) -> None:
    ca = trustme.CA()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("provider.test").configure_cert(server_tls)
    trusting = ssl.create_default_context()
    ca.configure_trust(trusting)
    async with Server(echo, tls=server_tls) as server:
        async with client_of(kind, tls=trusting) as client:
            # Pinned as webhooks and downloads are: the address in the URL, the name in SNI.
            response = await client.post(
                server.url(scheme="https"),
                content=b"secret",
                extensions={"sni_hostname": "provider.test"},
            )
            assert response.content == b"secret"
        async with client_of(kind, tls=trusting) as client:
            with pytest.raises(httpx.ConnectError):  # the certificate is not for this name
                await client.post(server.url(scheme="https"), content=b"secret")
        async with client_of(kind) as client:  # a CA the context does not trust
            with pytest.raises(httpx.ConnectError):
                await client.post(
                    server.url(scheme="https"),
                    content=b"secret",
                    extensions={"sni_hostname": "provider.test"},
                )


async def test_a_silent_tls_handshake_is_a_connect_timeout(kind: str) -> None:
    async with Server(never_answer) as server, client_of(kind, seconds=0.2) as client:
        with pytest.raises(httpx.ConnectTimeout):
            await client.get(server.url(scheme="https"))


async def test_a_late_answer_is_a_read_timeout_and_a_provider_timeout(kind: str) -> None:
    endpoint = Endpoint(provider="p", adapter="openai", timeout_seconds=0.2)
    async with Server(never_answer) as server, client_of(kind) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post(server.url(), content=b"a", timeout=0.2)
        with pytest.raises(ProviderFailure) as failure:
            await call(client, endpoint, "POST", server.url(), content=b"a")
        assert failure.value.kind == TIMEOUT


async def test_an_upload_the_server_does_not_read_is_a_write_timeout(kind: str) -> None:
    async def unread(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(3600)

    async with Server(unread) as server, client_of(kind) as client:
        with pytest.raises(httpx.WriteTimeout):
            await client.post(server.url(), content=b"x" * (64 * 1024 * 1024), timeout=0.5)


async def test_a_full_pool_is_a_pool_timeout(kind: str) -> None:
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with Server(never_answer) as server, client_of(kind, limits=limits) as client:
        held = asyncio.create_task(client.post(server.url(), content=b"a", timeout=5.0))
        await asyncio.sleep(0.1)
        with pytest.raises(httpx.PoolTimeout):
            await client.post(server.url(), content=b"b", timeout=0.2)
        held.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await held


async def test_refused_and_dropped_connections_are_unreachable(kind: str) -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    endpoint = Endpoint(provider="p", adapter="openai", timeout_seconds=2.0)
    async with Server(hang_up) as server, client_of(kind) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post(server.url(), content=b"a")
        with pytest.raises(ProviderFailure) as failure:
            await call(client, endpoint, "POST", server.url(), content=b"a")
        assert failure.value.kind == UNREACHABLE
        closed = server.port
    async with client_of(kind) as client:
        with pytest.raises(httpx.ConnectError):
            await client.post(f"http://{LOOPBACK}:{closed}/", content=b"a")


async def test_a_host_whose_first_address_refuses_is_reached_at_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A provider's name resolves to several addresses: they are tried in turn (raced, RFC
    8305), so one that refuses does not make the provider unreachable. 127.0.0.2 is
    loopback too, but the server listens on 127.0.0.1 only. (The gateway's transport alone:
    httpx's own resolves through anyio, not the event loop this test steers.)"""
    loop = asyncio.get_running_loop()
    real = type(loop).getaddrinfo

    async def two_addresses(
        self: asyncio.AbstractEventLoop, host: object, port: object, *args: object, **kwargs: object
    ) -> list[tuple]:  # type: ignore[type-arg]
        if host != "provider.test":
            return await real(self, host, port, *args, **kwargs)  # type: ignore[no-any-return]
        return [
            (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.2", port)),
            (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (LOOPBACK, port)),
        ]

    monkeypatch.setattr(type(loop), "getaddrinfo", two_addresses)
    async with Server(echo) as server, client_of("http11") as client:
        response = await client.post(f"http://provider.test:{server.port}/", content=b"hi")
        assert response.content == b"hi"


async def test_a_cancelled_request_leaves_no_broken_connection(kind: str) -> None:
    """Cancelled while waiting for its answer: the connection is not reused for the next
    request, whose answer is its own, not the late one."""
    answered = asyncio.Event()

    async def slow_then_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await read_request(reader)
        assert request is not None
        if request[1] == b"slow":
            await asyncio.sleep(0.2)
            writer.write(answer(b"late"))
            answered.set()
        else:
            writer.write(answer(request[1]))
        await writer.drain()
        await echo(reader, writer)

    async with Server(slow_then_echo) as server, client_of(kind) as client:
        first = asyncio.create_task(client.post(server.url(), content=b"slow"))
        await asyncio.sleep(0.05)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        await asyncio.wait_for(answered.wait(), 2.0)
        for body in (b"one", b"two"):
            assert (await client.post(server.url(), content=body)).content == body
        assert server.connections == 2


async def test_cookies_are_still_refused(kind: str) -> None:
    async def sets_cookies(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (request := await read_request(reader)) is not None:
            assert b"cookie:" not in request[0].lower()
            writer.write(
                b"HTTP/1.1 200 OK\r\nSet-Cookie: session=a; Path=/\r\nContent-Length: 2\r\n\r\nok"
            )
            await writer.drain()

    async with Server(sets_cookies) as server, client_of(kind) as client:
        for _ in range(2):
            assert (await client.post(server.url(), content=b"a")).content == b"ok"
        assert len(client.cookies.jar) == 0


async def test_the_jar_stores_nothing_even_when_asked() -> None:
    async with client_of("http11") as client:
        client.cookies.set("session", "a", domain="provider.test")
        assert len(client.cookies.jar) == 0
        client.cookies = {"session": "b"}
        assert len(client.cookies.jar) == 0


async def test_a_quiet_connection_asks_the_kernel_whether_it_was_closed() -> None:
    """A close the event loop has not delivered yet (reading paused here to hold it back)
    still makes a connection quiet for a second unusable, so the pool drops it."""
    loop = asyncio.get_running_loop()
    async with Server(never_answer) as server:
        _, connection = await loop.create_connection(_Connection, LOOPBACK, server.port)
        assert connection.usable(loop.time())
        assert connection.transport is not None
        connection.transport.pause_reading()
        await server.close_connections()
        await asyncio.sleep(0.05)
        assert connection.usable(loop.time())  # active a moment ago: the kernel is not asked
        connection.active_at -= 2.0
        assert not connection.usable(loop.time())
        connection.close()


def raw_server(*answers: bytes, close_after: bool = False) -> Handler:
    """Answers the connection's requests with `answers` in turn (raw bytes, as written),
    then keeps echoing (or closes, `close_after`)."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for raw in answers:
            if await read_request(reader) is None:
                return
            writer.write(raw)
            await writer.drain()
        if not close_after:
            await echo(reader, writer)

    return handler


async def test_a_chunked_answer_is_read_and_the_connection_kept(kind: str) -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n1;ext=1\r\n \r\n5\r\nworld\r\n0\r\nX-Trailer: t\r\n\r\n"
    )
    async with Server(raw_server(chunked)) as server, client_of(kind) as client:
        assert (await client.post(server.url(), content=b"a")).content == b"hello world"
        assert (await client.post(server.url(), content=b"next")).content == b"next"
        assert server.connections == 1


async def test_an_answer_ending_with_the_stream_is_read_to_its_end(kind: str) -> None:
    """No Content-Length and not chunked: the body is what comes until the server closes,
    and that connection is not reused."""
    until_close = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + b"z" * 100_000
    async with Server(raw_server(until_close, close_after=True)) as server:
        async with client_of(kind) as client:
            assert (await client.post(server.url(), content=b"a")).content == b"z" * 100_000
            response = await client.post(server.url(), content=b"b")
            assert response.content == b"z" * 100_000
        assert server.connections == 2


async def test_http_1_0_and_connection_close_answers_are_not_kept(kind: str) -> None:
    old = b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"
    closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
    for raw in (old, closing):
        async with Server(raw_server(raw, close_after=True)) as server:
            async with client_of(kind) as client:
                for _ in range(2):
                    response = await client.post(server.url(), content=b"a")
                    assert response.content == b"ok"
            assert server.connections == 2
    async with Server(raw_server(old)) as server, client_of(kind) as client:
        assert (await client.post(server.url(), content=b"a")).http_version == "HTTP/1.0"


async def test_informational_answers_are_skipped(kind: str) -> None:
    early = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n"
        b"HTTP/1.1 201 Created\r\nContent-Length: 4\r\n\r\ndone"
    )
    async with Server(raw_server(early)) as server, client_of(kind) as client:
        response = await client.post(server.url(), content=b"a")
        assert (response.status_code, response.content) == (201, b"done")
        assert "link" not in response.headers
        assert response.reason_phrase == "Created"
        assert (await client.post(server.url(), content=b"again")).content == b"again"


async def test_answers_without_a_body(kind: str) -> None:
    """204 and 304 carry no body whatever they say; HEAD's answer has none either."""
    no_content = b"HTTP/1.1 204 No Content\r\n\r\n"
    not_modified = b"HTTP/1.1 304 Not Modified\r\nETag: x\r\n\r\n"
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"
    async with (
        Server(raw_server(no_content, not_modified, head)) as server,
        client_of(kind) as client,
    ):
        assert (await client.post(server.url(), content=b"a")).status_code == 204
        assert (await client.get(server.url())).status_code == 304
        response = await client.head(server.url())
        assert (response.status_code, response.content) == (200, b"")
        assert response.headers["content-length"] == "1000"
        assert (await client.post(server.url(), content=b"still")).content == b"still"


async def test_an_answer_that_is_not_http_is_a_protocol_error(kind: str) -> None:
    endpoint = Endpoint(provider="p", adapter="openai", timeout_seconds=2.0)
    for raw in (
        b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc",
        b"HTTP/1.1 200 OK\r\nBad Header\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ):
        async with Server(raw_server(raw, close_after=True)) as server, client_of(kind) as client:
            with pytest.raises(httpx.RemoteProtocolError):
                await client.post(server.url(), content=b"a")
            with pytest.raises(ProviderFailure) as failure:
                await call(client, endpoint, "POST", server.url(), content=b"a")
            assert failure.value.kind == UNREACHABLE


async def test_an_endless_head_is_refused_not_buffered(kind: str) -> None:
    """A server (or a URL someone else named) sending header after header, or 1xx answer
    after 1xx answer, without end: the request fails instead of buffering it all."""

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for index in range(20_000):
            writer.write(b"X-Filler-%d: %s\r\n" % (index, b"f" * 100))
            await writer.drain()
        writer.write(b"Content-Length: 0\r\n\r\n")

    async def informational(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        for _ in range(20_000):
            writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n")
            await writer.drain()

    for handler in (endless, informational):
        async with Server(handler) as server, client_of(kind, seconds=10.0) as client:
            with pytest.raises(httpx.RemoteProtocolError):
                await client.post(server.url(), content=b"a")


async def test_a_body_cut_short_is_a_protocol_error(kind: str) -> None:
    short = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"
    async with Server(raw_server(short, close_after=True)) as server, client_of(kind) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post(server.url(), content=b"a")


@pytest.mark.parametrize(
    "headers",
    [
        {"x-injected": "a\r\nX-Evil: 1"},
        {"x-injected": "a\nb"},
        {"x-injected": "a\x00b"},
        {"bad name": "a"},
        {"x:colon": "a"},
    ],
)
async def test_a_header_that_could_split_the_request_is_refused(
    kind: str, headers: dict[str, str]
) -> None:
    """A header value from somewhere else (a BYOK key, a provider's token) with CR, LF or NUL
    never reaches the wire."""
    async with Server(echo) as server, client_of(kind) as client:
        with pytest.raises(httpx.LocalProtocolError):
            await client.post(server.url(), content=b"a", headers=headers)
        assert (await client.post(server.url(), content=b"ok")).content == b"ok"


async def test_an_early_answer_to_an_unread_upload_is_returned(kind: str) -> None:
    """A server that refuses an upload answers and closes before reading it: the answer is
    what the caller gets (a 413 the adapter can read), not a write error: what arrived
    before the reset was already read by the event loop."""

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 413 Too Large\r\nConnection: close\r\nContent-Length: 3\r\n\r\nbig")
        await writer.drain()
        writer.transport.abort()

    async with Server(refuse) as server, client_of(kind) as client:
        if kind == "httpx":  # httpcore reads after the reset, which lost what was received
            with pytest.raises(httpx.TransportError):
                await client.post(server.url(), content=b"x" * (8 * 1024 * 1024))
            return
        response = await client.post(server.url(), content=b"x" * (8 * 1024 * 1024))
        assert (response.status_code, response.content) == (413, b"big")


async def test_a_full_pool_hands_connections_over(kind: str) -> None:
    """One connection allowed: concurrent requests take turns on it, to one origin or two."""
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with (
        Server(echo) as first,
        Server(echo) as second,
        client_of(kind, limits=limits) as client,
    ):
        bodies = [f"{index}".encode() * 1000 for index in range(12)]
        answers = await asyncio.gather(
            *(
                client.post((first if index % 3 else second).url(), content=body)
                for index, body in enumerate(bodies)
            )
        )
        assert [answer.content for answer in answers] == bodies
        assert first.connections >= 1 and second.connections >= 1


async def test_a_stream_closed_early_does_not_leave_its_connection_in_the_pool(kind: str) -> None:
    body = b"y" * (2 * 1024 * 1024)
    async with Server(echo) as server, client_of(kind) as client:
        async with client.stream("POST", server.url(), content=body) as response:
            async for _ in response.aiter_raw():
                break
        assert (await client.post(server.url(), content=b"fresh")).content == b"fresh"
        assert server.connections == 2


async def test_keep_alive_limits_are_honoured(kind: str) -> None:
    none_kept = httpx.Limits(max_connections=10, max_keepalive_connections=0)
    async with Server(echo) as server, client_of(kind, limits=none_kept) as client:
        for _ in range(2):
            assert (await client.post(server.url(), content=b"a")).content == b"a"
        assert server.connections == 2
    expiring = httpx.Limits(max_connections=10, max_keepalive_connections=10, keepalive_expiry=0.1)
    async with Server(echo) as server, client_of(kind, limits=expiring) as client:
        assert (await client.post(server.url(), content=b"a")).content == b"a"
        assert (await client.post(server.url(), content=b"b")).content == b"b"
        assert server.connections == 1
        await asyncio.sleep(0.3)
        assert (await client.post(server.url(), content=b"c")).content == b"c"
        assert server.connections == 2


async def test_the_pool_counts_every_connection_back() -> None:
    """After successes, failures, cancellations and early closes, the pool's count of open
    connections is what is really open: a request later still gets a place."""
    limits = httpx.Limits(max_connections=2, max_keepalive_connections=2)
    transport = Http11Transport(ssl.create_default_context(), limits)
    async with (
        Server(echo) as server,
        Server(never_answer) as silent,
        httpx.AsyncClient(transport=transport, timeout=5.0) as client,
    ):
        for _ in range(3):
            await client.post(server.url(), content=b"a")
            with pytest.raises(httpx.ReadTimeout):
                await client.post(silent.url(), content=b"a", timeout=0.05)
            pending = asyncio.create_task(client.post(silent.url(), content=b"a"))
            await asyncio.sleep(0.02)
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pending
            async with client.stream("POST", server.url(), content=b"b" * 500_000) as response:
                async for _ in response.aiter_raw():
                    break
        assert transport.open_connections == transport.idle_connections <= 2
        assert (await client.post(server.url(), content=b"end")).content == b"end"


async def test_a_pool_wait_ended_just_as_it_was_granted_gives_the_place_back() -> None:
    """A request waiting for a place at max_connections is granted one (a connection freed)
    in the same moment as it is cancelled (or its pool timeout fires): the place goes back to
    the pool, not lost with the request."""
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    transport = Http11Transport(ssl.create_default_context(), limits)
    request = httpx.Request("GET", "http://127.0.0.1:9/")
    origin = ("http", "127.0.0.1", 9, None)
    transport._open = 1  # the one place is taken by a request in flight
    waiting = asyncio.create_task(transport._wait_for_slot(origin, 5.0, request))
    await asyncio.sleep(0)
    transport._free_slot()  # the request in flight ends: its place passes to the waiter...
    waiting.cancel()  # ...which is cancelled before it runs again
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert transport.open_connections == 0
    assert not transport._waiters


async def test_a_complete_answer_reads_and_streams_as_before(kind: str) -> None:
    """An answer that arrived whole with its head (read at once by the gateway's transport)
    still streams, and a compressed one is decoded as the caller reads it."""
    packed = gzip.compress(b'{"text": "' + b"a" * 5000 + b'"}')

    async def both(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (request := await read_request(reader)) is not None:
            if request[0].startswith(b"POST /gzip"):
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: "
                    + str(len(packed)).encode()
                    + b"\r\n\r\n"
                    + packed
                )
            else:
                writer.write(answer(request[1]))
            await writer.drain()

    async with Server(both) as server, client_of(kind) as client:
        response = await client.post(server.url("/plain"), content=b'{"text": "hi"}')
        assert response.json() == {"text": "hi"}
        async with client.stream("POST", server.url("/plain"), content=b"0123456789") as streamed:
            assert b"".join([chunk async for chunk in streamed.aiter_bytes()]) == b"0123456789"
        async with client.stream("POST", server.url("/gzip"), content=b"x") as streamed:
            assert "content-encoding" in streamed.headers
            text = b"".join([chunk async for chunk in streamed.aiter_bytes()])
        assert text == gzip.decompress(packed)
        assert server.connections == 1


# --- `send` hands a request straight to the transport when nothing else takes part ---------


def recording(answers: list[bytes], seen: list[bytes]) -> Handler:
    """Records each request's bytes (head and body) and answers with the next of `answers`."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (request := await read_request(reader)) is not None:
            seen.append(request[0] + request[1])
            writer.write(answers[len(seen) - 1])
            await writer.drain()

    return handler


async def test_send_without_the_clients_layers_is_the_clients_send() -> None:
    """The same built request through the client's own send and through `send`'s direct
    path: the same bytes reach the provider, the same answer comes back (status, headers,
    body, its request), and a provider's error is the same failure."""
    from server.providers.http import send

    body = b'{"text": "hello"}'
    error = b'{"error": {"code": "rate_limit_exceeded", "message": "slow down"}}'
    too_many = (
        b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\nContent-Length: "
        + str(len(error)).encode()
        + b"\r\n\r\n"
        + error
    )
    answers = [answer(body), answer(body), too_many, too_many]
    seen: list[bytes] = []
    async with Server(recording(answers, seen)) as server, client_of("http11") as client:
        assert getattr(client, "direct", None) is not None

        def built() -> httpx.Request:
            return client.build_request(
                "POST",
                server.url(),
                content=b"audio" * 1000,
                headers={"Authorization": "Bearer k", "Content-Type": "audio/wav"},
                timeout=3.0,
            )

        through_client = await client.send(built())
        through_send = await send(client, built())
        assert seen[0] == seen[1]
        for response in (through_client, through_send):
            assert response.status_code == 200
            assert response.content == body
            assert response.json() == {"text": "hello"}
            assert response.request.url == server.url()
            assert response.is_closed
        assert through_client.headers.multi_items() == through_send.headers.multi_items()
        failures = []
        for _ in range(2):
            with pytest.raises(ProviderFailure) as failure:
                await send(client, built())
            failures.append(failure.value)
        assert failures[0].kind == failures[1].kind
        assert str(failures[0]) == str(failures[1])
        assert server.connections == 1


async def test_send_goes_through_the_client_when_a_proxy_is_configured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """httpx mounts a proxy transport for the proxy variables of the environment: with one
    set, `send` must not go around the client (the proxy would be skipped)."""
    for variable in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY"):
        monkeypatch.delenv(variable, raising=False)
        monkeypatch.delenv(variable.lower(), raising=False)
    assert provider_client(ssl.create_default_context()).direct is not None  # type: ignore[attr-defined]
    monkeypatch.setenv("HTTPS_PROXY", f"http://{LOOPBACK}:9")
    assert provider_client(ssl.create_default_context()).direct is None  # type: ignore[attr-defined]
    assert provider_client(ssl.create_default_context(), transport="httpx").direct is None  # type: ignore[attr-defined]


async def test_a_body_cut_short_through_send_closes_the_answer() -> None:
    """An answer whose body ends before its Content-Length, read through `send`'s direct
    path: the provider is unreachable (as through the client's send), and the broken
    connection does not serve the next request."""
    from server.providers.http import send

    cut = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 70_000

    async def cut_then_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(cut)
        await writer.drain()

    async with Server(cut_then_echo) as server, client_of("http11") as client:
        with pytest.raises(ProviderFailure) as failure:
            await send(client, client.build_request("POST", server.url(), content=b"a"))
        assert failure.value.kind == UNREACHABLE
        transport = client.direct  # type: ignore[attr-defined]
        assert transport.idle_connections == 0
