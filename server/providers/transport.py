"""The pooled provider client's transport: httpcore's connection pool (HTTP/1.1 over h11,
keep-alive, limits, pool timeouts, cancellation handling: all httpcore's own) over a network
backend written on asyncio's own protocols instead of httpcore's default, anyio.

Why: this path costs about 0.2 ms less CPU per provider call than anyio's, over plain HTTP
or TLS (bench/provider_call.py, paired rounds: x0.67 at concurrency 1 and 4). Every
read and write enters a cancel scope (`fail_after`) and yields to the event loop once before
doing anything (anyio's checkpoint), and the pool asks every idle connection per request
whether its socket is readable with a poll(2) syscall. Here a read of data already received
returns at once, a wait is one future with one timer, the request's head and a body up to
64 KiB leave in one send (httpcore writes them separately), and whether an idle connection
was closed by the server is known from what the event loop has already delivered (the kernel
is asked only about connections quiet for a second).

Both are documented extension points: httpcore's `AsyncNetworkBackend` /
`AsyncNetworkStream` (passed as `network_backend=` to `httpcore.AsyncConnectionPool`) and
httpx's custom transports (`httpx.AsyncBaseTransport`). Failures are httpcore's exceptions
(ConnectTimeout, ReadTimeout, WriteTimeout, ConnectError, ReadError, WriteError), mapped to
httpx's as httpx's own transport maps them, so callers see the same httpx exception types.
"""

from __future__ import annotations

import asyncio
import select
import ssl
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from typing import Any

import httpcore
import httpx

# Reading stops (the kernel's buffer and TCP flow control take over) while this much is
# received and not yet read, and resumes below the low mark: bounded memory per connection.
_READ_HIGH = 256 * 1024
_READ_LOW = 64 * 1024
# Writes are held and sent together, at the latest when the response is first read, while
# they stay under this size (asyncio's default high-water mark for a transport's buffer).
_COALESCE_BYTES = 64 * 1024
# A connection quiet this long is also asked the kernel whether it is readable (a close the
# event loop has not delivered yet): only the ones a server may have closed for idleness pay
# the syscall, not every idle connection on every request.
_QUIET_SECONDS = 1.0
# anyio's connect_tcp default: a second address family is tried after this long.
_HAPPY_EYEBALLS_DELAY = 0.25

_EXPIRED = False  # a waiter's result when its timer fired first
_WOKEN = True


def _expire(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(_EXPIRED)


def _wake(waiter: asyncio.Future[bool] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(_WOKEN)


class _Connection(asyncio.Protocol):
    """What the event loop delivers on one connection: received bytes, end of stream, loss,
    and write flow control; one reader and one writer wait on it at a time (httpcore's
    HTTP/1.1 connection reads and writes in turn)."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.active_at = self.loop.time()  # when bytes last came or went
        self.transport: asyncio.Transport | None = None
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.eof = False
        self.lost = False
        self.error: BaseException | None = None  # why the connection was lost, if not cleanly
        self.reader: asyncio.Future[bool] | None = None
        self.writer: asyncio.Future[bool] | None = None
        self.write_paused = False
        self.read_paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.active_at = self.loop.time()
        self.chunks.append(data)
        self.buffered += len(data)
        if self.buffered > _READ_HIGH and not self.read_paused and self.transport is not None:
            self.read_paused = True
            self.transport.pause_reading()
        _wake(self.reader)

    def eof_received(self) -> bool:
        self.eof = True
        _wake(self.reader)
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.error = exc
        _wake(self.reader)
        _wake(self.writer)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        _wake(self.writer)

    def take(self, max_bytes: int) -> bytes:
        chunk = self.chunks.popleft()
        if len(chunk) > max_bytes:
            self.chunks.appendleft(chunk[max_bytes:])
            chunk = chunk[:max_bytes]
        self.buffered -= len(chunk)
        if self.read_paused and self.buffered <= _READ_LOW and self.transport is not None:
            self.read_paused = False
            self.transport.resume_reading()
        return chunk


async def _wait(slot: str, connection: _Connection, seconds: float | None) -> bool:
    """Wait until the connection wakes the `slot` waiter ("reader" or "writer"); False when
    `seconds` passed first. A cancelled wait leaves nothing behind."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[bool] = loop.create_future()
    setattr(connection, slot, waiter)
    timer = loop.call_later(seconds, _expire, waiter) if seconds is not None else None
    try:
        return await waiter
    finally:
        setattr(connection, slot, None)
        if timer is not None:
            timer.cancel()


class AsyncioStream(httpcore.AsyncNetworkStream):
    """One connection as httpcore reads and writes it (its `timeout` arguments are
    httpcore's interface, hence the noqa on them)."""

    def __init__(self, connection: _Connection, coalesce_bytes: int = _COALESCE_BYTES) -> None:
        self._connection = connection
        self._coalesce_bytes = coalesce_bytes
        self._pending: list[bytes] = []  # written, not yet handed to the transport
        self._pending_bytes = 0
        self._pending_timeout: float | None = None

    def _transport(self) -> asyncio.Transport:
        transport = self._connection.transport
        assert transport is not None
        return transport

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        connection = self._connection
        if self._pending:
            await self._flush(self._pending_timeout)
        while not connection.chunks:
            if connection.eof or connection.lost:
                if connection.error is not None:
                    raise httpcore.ReadError(str(connection.error)) from connection.error
                return b""
            if not await _wait("reader", connection, timeout):
                raise httpcore.ReadTimeout("timed out reading")
        return connection.take(max_bytes)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        if not buffer:
            return
        connection = self._connection
        if connection.lost or self._transport().is_closing():
            raise httpcore.WriteError(str(connection.error or "connection closed"))
        self._pending.append(buffer)
        self._pending_bytes += len(buffer)
        self._pending_timeout = timeout
        if self._pending_bytes >= self._coalesce_bytes:
            await self._flush(timeout)

    async def _flush(self, seconds: float | None) -> None:
        """Hand what was written to the transport (one send when it is small), then wait
        while the transport's buffer is above its high-water mark."""
        pending, size = self._pending, self._pending_bytes
        self._pending, self._pending_bytes = [], 0
        connection = self._connection
        transport = self._transport()
        if connection.lost or transport.is_closing():
            return  # reading will tell why (httpcore reads the answer after a write error)
        connection.active_at = connection.loop.time()
        if len(pending) == 1:
            transport.write(pending[0])
        elif size < self._coalesce_bytes:
            transport.write(b"".join(pending))
        else:
            for buffer in pending:  # large: no copy to join them
                transport.write(buffer)
        while connection.write_paused and not connection.lost:
            if not await _wait("writer", connection, seconds):
                raise httpcore.WriteTimeout("timed out writing")

    async def aclose(self) -> None:
        self._pending = []
        self._pending_bytes = 0
        transport = self._connection.transport
        if transport is None or transport.is_closing():
            return
        # No TLS close_notify (httpcore's anyio backend sends none either) and nothing
        # unsent kept waiting for a peer that may never read it.
        if transport.get_extra_info("ssl_object") is not None or transport.get_write_buffer_size():
            transport.abort()
        else:
            transport.close()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> httpcore.AsyncNetworkStream:
        if self._pending:
            await self._flush(timeout)
        loop = asyncio.get_running_loop()
        connection = self._connection
        try:
            async with asyncio.timeout(timeout):
                transport = await loop.start_tls(
                    self._transport(),
                    connection,
                    ssl_context,
                    server_hostname=server_hostname,
                    # asyncio's own 60 s default would end a longer `timeout` early.
                    ssl_handshake_timeout=None if timeout is None else timeout + 1.0,
                )
        except TimeoutError as exc:
            self._transport().abort()
            raise httpcore.ConnectTimeout("timed out during the TLS handshake") from exc
        except OSError as exc:  # ssl.SSLError (a refused certificate) is one
            self._transport().abort()
            raise httpcore.ConnectError(str(exc)) from exc
        if transport is None:  # the connection was lost during the handshake
            raise httpcore.ConnectError("connection lost during the TLS handshake")
        connection.transport = transport
        return self

    def get_extra_info(self, info: str) -> Any:
        connection = self._connection
        transport = connection.transport
        if info == "is_readable":
            # Whether a read would not block: an idle connection that is readable was closed
            # (or spoken to out of turn) by the server, and the pool drops it.
            if connection.chunks or connection.eof or connection.lost or transport is None:
                return True
            if connection.loop.time() - connection.active_at < _QUIET_SECONDS:
                return False
            return _socket_readable(transport)
        if transport is None:
            return None
        if info == "ssl_object":
            return transport.get_extra_info("ssl_object")
        if info == "client_addr":
            return transport.get_extra_info("sockname")
        if info == "server_addr":
            return transport.get_extra_info("peername")
        if info == "socket":
            return transport.get_extra_info("socket")
        return None


def _socket_readable(transport: asyncio.Transport) -> bool:
    """Whether the kernel holds bytes (or the end of stream) the event loop has not read."""
    sock = transport.get_extra_info("socket")
    if sock is None or sock.fileno() < 0:
        return True
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    return bool(poller.poll(0))


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    """`coalesce_bytes`: writes held and sent together while under this size (0: none)."""

    def __init__(self, coalesce_bytes: int = _COALESCE_BYTES) -> None:
        self._coalesce_bytes = coalesce_bytes

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                _, connection = await loop.create_connection(
                    _Connection,
                    host,
                    port,
                    local_addr=(local_address, 0) if local_address else None,
                    happy_eyeballs_delay=_HAPPY_EYEBALLS_DELAY,
                )
        except TimeoutError as exc:  # before OSError: TimeoutError is one
            raise httpcore.ConnectTimeout(str(exc) or "timed out connecting") from exc
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        return self._stream(connection, socket_options)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                _, connection = await loop.create_unix_connection(_Connection, path)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(str(exc) or "timed out connecting") from exc
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        return self._stream(connection, socket_options)

    def _stream(
        self, connection: _Connection, socket_options: Iterable[httpcore.SOCKET_OPTION] | None
    ) -> AsyncioStream:
        # asyncio sets TCP_NODELAY on TCP connections itself, as anyio does.
        if socket_options:
            assert connection.transport is not None
            sock = connection.transport.get_extra_info("socket")
            for option in socket_options:
                sock.setsockopt(*option)
        return AsyncioStream(connection, self._coalesce_bytes)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


# httpcore's exceptions as httpx's, the most specific first (httpx's own transport maps
# them so: httpx/_transports/default.py).
_ERRORS: tuple[tuple[type[Exception], type[httpx.TransportError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.ProxyError, httpx.ProxyError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.ProtocolError, httpx.ProtocolError),
)


def _as_httpx(exc: Exception) -> Exception | None:
    for core, mapped in _ERRORS:
        if isinstance(exc, core):
            return mapped(str(exc))
    return None


class _ResponseStream(httpx.AsyncByteStream):
    def __init__(self, stream: AsyncIterable[bytes]) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for part in self._stream:
                yield part
        except Exception as exc:
            mapped = _as_httpx(exc)
            if mapped is None:
                raise
            raise mapped from exc

    async def aclose(self) -> None:
        aclose = getattr(self._stream, "aclose", None)
        if aclose is not None:
            await aclose()


class PooledTransport(httpx.AsyncBaseTransport):
    """httpx's AsyncHTTPTransport without a proxy, over `network_backend`."""

    def __init__(
        self,
        ssl_context: ssl.SSLContext,
        limits: httpx.Limits,
        network_backend: httpcore.AsyncNetworkBackend | None = None,
    ) -> None:
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            http1=True,
            http2=False,
            network_backend=network_backend or AsyncioBackend(),
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.AsyncByteStream)
        url = request.url
        core_request = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        try:
            response = await self._pool.handle_async_request(core_request)
        except Exception as exc:
            mapped = _as_httpx(exc)
            if mapped is None:
                raise
            raise mapped from exc
        assert isinstance(response.stream, AsyncIterable)
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_ResponseStream(response.stream),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._pool.aclose()
