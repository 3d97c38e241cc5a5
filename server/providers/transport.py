"""The pooled provider client's transport: HTTP/1.1 over asyncio's protocols, answers
parsed by llhttp (`httptools`, the parser uvicorn serves with), connections kept alive in a
pool per origin under httpx's limits and timeouts. An `httpx.AsyncBaseTransport` (httpx's
documented extension point), so callers keep the one httpx client and its exception types.

Why not httpx's own transport (httpcore's pool, the h11 state machine, anyio): a provider call
of a transcription (a 32 KB upload, a small JSON answer) spent several times the CPU in
httpcore and h11, even over an asyncio network backend of ours, that the same bytes cost
written and read on a bare asyncio connection; the provider call was the largest
piece of the gateway's CPU per transcription left above its floor (issue 17; `python -m
bench.provider_call`). Here a request's head and body up to
64 KiB leave in one send, a read of bytes already received returns at once, a wait is one
future timed by its connection's one alarm (not a timer scheduled and cancelled per wait),
the answer is parsed in C and handed over already read, and whether an idle connection was
closed by the server is known from what the event loop has already delivered (the kernel is
asked only about connections quiet for a second).

What it does, as httpx's own transport does: HTTP/1.1 keep-alive (an answer read to its end
on a connection both sides keep open puts it back in the pool; anything else closes it);
`max_connections` (a request past it waits for a connection up to its pool timeout:
httpx.PoolTimeout), `max_keepalive_connections` and `keepalive_expiry`; connect, read, write
and pool timeouts per request (httpx's `timeout` extension); TLS verified with the given
context, with SNI (the `sni_hostname` extension when given: a DNS-pinned request's name);
request bodies with Content-Length or chunked, as httpx framed them; answers with
Content-Length, chunked, or read to the end of the stream; informational (1xx) answers
skipped; a request cancelled mid-way closes its connection. Refused: a header name or value
that could split the request (httpx.LocalProtocolError), an answer llhttp does not accept
(httpx.RemoteProtocolError). No proxies, no HTTP/2, no upgrades: the provider client uses
none of them.
"""

from __future__ import annotations

import asyncio
import math
import re
import select
import socket
import ssl
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

import aiohappyeyeballs
import httptools
import httpx

# Reading stops (the kernel's buffer and TCP flow control take over) while this much is
# received and not yet read, and resumes below the low mark: bounded memory per connection.
_READ_HIGH = 256 * 1024
_READ_LOW = 64 * 1024
# A request's head and body leave in one send while together under this size (asyncio's
# default high-water mark for a transport's buffer); larger bodies are written as they are.
_COALESCE_BYTES = 64 * 1024
# A connection quiet this long is also asked the kernel whether it is readable (a close the
# event loop has not delivered yet): only the ones a server may have closed for idleness pay
# the syscall, not every idle connection on every request.
_QUIET_SECONDS = 1.0
# anyio's connect_tcp default (httpx's own transport): a second address family is tried after
# this long.
_HAPPY_EYEBALLS_DELAY = 0.25
# The most an answer's head (with any 1xx answers before it) may take: a server sending
# endless headers (a URL someone else named is fetched too) is refused, not buffered
# (httpcore's limit for h11).
_MAX_HEAD_BYTES = 100 * 1024
# Idle connections past their keep-alive expiry are closed at most this often.
_SWEEP_SECONDS = 1.0

# RFC 9110: a method and a header name are tokens; a header value holds no CR, LF or NUL
# (what could end the field or the head early); a request target has no space or control.
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FIELD_VALUE = re.compile(rb"[^\x00\r\n]*")
_TARGET = re.compile(rb"[^\x00-\x20\x7f]+")

# llhttp's version of an answer as httpx's `http_version` extension names it.
_VERSIONS = {"1.1": b"HTTP/1.1", "1.0": b"HTTP/1.0"}

_EXPIRED = False  # a waiter's result when its time was up first
_WOKEN = True


def _wake(waiter: asyncio.Future[bool] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(_WOKEN)


Origin = tuple[str, str, int, str | None]  # scheme, host, port, TLS server name


class _Connection(asyncio.Protocol):
    """What the event loop delivers on one connection: received bytes, end of stream, loss,
    and write flow control; one reader and one writer wait on it at a time."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.active_at = self.loop.time()  # when bytes last came or went
        self.idle_since = 0.0
        self.transport: asyncio.Transport | None = None
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.eof = False
        self.lost = False
        self.error: BaseException | None = None  # why the connection was lost, if not cleanly
        self.reader: asyncio.Future[bool] | None = None
        self.writer: asyncio.Future[bool] | None = None
        # When each waiter's time is up (inf: never). One alarm per connection serves both:
        # set for the earliest, left to ring when a wait ends early (then it finds nothing
        # due and rests, or is set again for a later wait): a wait costs no timer of its
        # own to schedule and cancel.
        self.reader_due = math.inf
        self.writer_due = math.inf
        self.alarm: asyncio.TimerHandle | None = None
        self.alarm_at = math.inf
        self.write_paused = False
        self.read_paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (create_connection's), whichever event loop's class it is.
        self.transport = cast(asyncio.Transport, transport)

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
        self._disarm()  # nothing left to time: the loop lets go of the connection

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        _wake(self.writer)

    def take(self) -> bytes:
        chunk = self.chunks.popleft()
        self.buffered -= len(chunk)
        if self.read_paused and self.buffered <= _READ_LOW and self.transport is not None:
            self.read_paused = False
            self.transport.resume_reading()
        return chunk

    def usable(self, now: float) -> bool:
        """Whether an idle connection can carry the next request: nothing arrived since its
        last answer and the server has not closed it."""
        transport = self.transport
        if self.chunks or self.eof or self.lost or transport is None or transport.is_closing():
            return False
        if now - self.active_at < _QUIET_SECONDS:
            return True
        return not _socket_readable(transport)

    def due(self, deadline: float) -> None:
        """Have the alarm ring no later than `deadline`."""
        if deadline < self.alarm_at:
            if self.alarm is not None:
                self.alarm.cancel()
            self.alarm = self.loop.call_at(deadline, self._ring)
            self.alarm_at = deadline

    def _ring(self) -> None:
        """The alarm: a waiter whose time is up gets _EXPIRED; the alarm is set again for
        the earliest still to come."""
        now = max(self.loop.time(), self.alarm_at)  # asyncio may ring a hair early
        self.alarm, self.alarm_at = None, math.inf
        if self.reader is not None and not self.reader.done():
            if self.reader_due <= now:
                self.reader.set_result(_EXPIRED)
            else:
                self.due(self.reader_due)
        if self.writer is not None and not self.writer.done():
            if self.writer_due <= now:
                self.writer.set_result(_EXPIRED)
            else:
                self.due(self.writer_due)

    def _disarm(self) -> None:
        if self.alarm is not None:
            self.alarm.cancel()
            self.alarm, self.alarm_at = None, math.inf

    def close(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        # No TLS close_notify (httpx's own transport sends none either) and nothing unsent
        # kept waiting for a peer that may never read it.
        if transport.get_extra_info("ssl_object") is not None or transport.get_write_buffer_size():
            transport.abort()
        else:
            transport.close()


def _socket_readable(transport: asyncio.Transport) -> bool:
    """Whether the kernel holds bytes (or the end of stream) the event loop has not read."""
    sock = transport.get_extra_info("socket")
    if sock is None or sock.fileno() < 0:
        return True
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    return bool(poller.poll(0))


async def _wait(reading: bool, connection: _Connection, seconds: float | None) -> bool:
    """Wait until the connection wakes its reader (`reading`) or writer; False when
    `seconds` passed first. A cancelled wait leaves no waiter behind (the connection's alarm
    may still ring once, for nothing)."""
    loop = connection.loop
    waiter: asyncio.Future[bool] = loop.create_future()
    due = math.inf if seconds is None else loop.time() + seconds
    if reading:
        connection.reader, connection.reader_due = waiter, due
    else:
        connection.writer, connection.writer_due = waiter, due
    if seconds is not None:
        connection.due(due)
    try:
        return await waiter
    finally:
        if reading:
            connection.reader = None
        else:
            connection.writer = None


@dataclass(eq=False)
class _Answer:
    """llhttp's callbacks for one answer (httptools calls these methods by name)."""

    request: httpx.Request
    head_only: bool  # an answer to HEAD: no body follows its head
    parser: Any = None  # httptools.HttpResponseParser(self)
    status: int = 0
    reason: bytes = b""
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: deque[bytes] = field(default_factory=deque)
    head_done: bool = False
    complete: bool = False
    until_eof: bool = False  # no Content-Length, not chunked: the body ends with the stream
    extra: bool = False  # bytes beyond the answer: the connection is not clean
    keep_alive: bool = False  # both sides keep the connection (read as the answer ends)

    # Bytes after the answer, in the same read, are parsed on as the next message: they
    # change nothing of this answer and only mark the connection as not clean.

    def on_message_begin(self) -> None:
        if self.complete:
            self.extra = True

    def on_status(self, reason: bytes) -> None:
        if not self.complete:
            self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.complete:
            self.extra = True
        elif not self.head_done:  # after the head: a chunked answer's trailer, not a header
            # llhttp drops the whitespace before a value, not after (RFC 9110 5.5: neither
            # is part of it).
            self.headers.append((name, value.rstrip(b" \t")))

    def on_headers_complete(self) -> None:
        if self.complete:
            self.extra = True
            return
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            if status == 101:
                raise httpx.RemoteProtocolError(
                    "the server switched protocols unasked", request=self.request
                )
            self.headers = []  # informational: the real answer follows
            self.reason = b""
            return
        self.status = status
        self.head_done = True
        framed = status in (204, 304)
        for name, value in self.headers:
            lowered = name.lower()
            if lowered == b"content-length" or (
                lowered == b"transfer-encoding" and b"chunked" in value.lower()
            ):
                framed = True
        if self.head_only:  # a fresh parser reads the next answer: none of this one is left
            self.complete = True
            self.keep_alive = self._keeps_alive()
            return
        self.until_eof = not framed

    def on_body(self, body: bytes) -> None:
        if self.head_done and not self.complete:
            self.body.append(body)

    def on_message_complete(self) -> None:
        if self.head_done and not self.complete:
            self.complete = True
            self.keep_alive = self._keeps_alive()

    def _keeps_alive(self) -> bool:
        """Whether the server keeps the connection (RFC 9112 9.3): HTTP/1.1 or later without
        `Connection: close`, as httpx's own transport (h11) reads it; llhttp's
        should_keep_alive would close after a later version. HTTP/1.0 connections are not
        kept (nor are they by httpx's own transport). How the body ended is the caller's
        (`until_eof`)."""
        major, _, minor = self.parser.get_http_version().partition(".")
        if (int(major), int(minor or 0)) < (1, 1):
            return False
        for name, value in self.headers:
            if name.lower() == b"connection" and b"close" in (
                token.strip().lower() for token in value.split(b",")
            ):
                return False
        return True


class _Framing(NamedTuple):
    """A request's head, and how its body is framed."""

    head: bytes
    chunked: bool
    length: int | None  # its Content-Length


def _head(request: httpx.Request) -> _Framing:
    """The request's head, and how its body is framed (chunked, Content-Length); refuses
    what could split it (httpx.LocalProtocolError)."""
    method = request.method.encode("ascii", "replace")
    target = request.url.raw_path
    if not _TOKEN.fullmatch(method) or not _TARGET.fullmatch(target):
        raise httpx.LocalProtocolError("Illegal request method or target", request=request)
    parts = [method, b" ", target, b" HTTP/1.1\r\n"]
    chunked = False
    length: int | None = None
    host = False
    for name, value in request.headers.raw:
        if not _TOKEN.fullmatch(name) or not _FIELD_VALUE.fullmatch(value):
            raise httpx.LocalProtocolError("Illegal header name or value", request=request)
        lowered = name.lower()
        if lowered == b"host":
            host = True
        elif lowered == b"content-length":
            try:
                length = int(value)
            except ValueError:
                raise httpx.LocalProtocolError("Illegal Content-Length", request=request) from None
        elif lowered == b"transfer-encoding":
            chunked = value.strip().lower() == b"chunked"
            if not chunked:
                raise httpx.LocalProtocolError(
                    "Transfer-Encoding other than chunked", request=request
                )
        parts += (name, b": ", value, b"\r\n")
    if not host:
        parts[4:4] = (b"Host: ", request.url.netloc, b"\r\n")
    parts.append(b"\r\n")
    return _Framing(b"".join(parts), chunked, length)


class _WriteFailed(Exception):
    """The connection went away while the request was written: its answer may still be
    readable (a server that refuses an upload answers, then closes)."""


@dataclass(eq=False)
class _SlotWaiter:
    origin: Origin
    future: asyncio.Future[_Connection | None]


class Http11Transport(httpx.AsyncBaseTransport):
    """The provider client's transport (the module docstring): `ssl_context` verifies TLS;
    `limits` as httpx's own transport takes them."""

    def __init__(self, ssl_context: ssl.SSLContext, limits: httpx.Limits) -> None:
        self._tls = ssl_context
        self._max_connections = limits.max_connections
        self._max_idle = limits.max_keepalive_connections
        self._expiry = limits.keepalive_expiry
        self._idle: dict[Origin, list[_Connection]] = {}
        self._idle_count = 0
        self._open = 0  # connections open or being opened, idle ones included
        self._waiters: deque[_SlotWaiter] = deque()
        self._swept_at = 0.0
        self._closed = False

    @property
    def open_connections(self) -> int:
        return self._open

    @property
    def idle_connections(self) -> int:
        return self._idle_count

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        scheme = url.scheme
        if scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(
                f"Request URL has an unsupported protocol '{scheme}://'", request=request
            )
        if self._closed:
            raise RuntimeError("the transport is closed")
        extensions = request.extensions
        timeouts: Mapping[str, float | None] = extensions.get("timeout", {})
        host = url.raw_host.decode("ascii")
        sni = None
        if scheme == "https":
            sni = extensions.get("sni_hostname") or host
        origin: Origin = (scheme, host, url.port or (443 if scheme == "https" else 80), sni)
        framing = _head(request)
        connection = await self._acquire(origin, timeouts, request)
        answer = _Answer(request, request.method == "HEAD")
        answer.parser = httptools.HttpResponseParser(answer)
        try:
            written = await self._write(connection, request, framing, timeouts.get("write"))
            await self._read_head(connection, answer, timeouts.get("read"), written)
        except BaseException:
            answer.parser = None  # (the cycle _Body._abandon breaks)
            self.discard(connection)
            raise
        body = _Body(self, origin, connection, answer, written, timeouts.get("read"))
        version = answer.parser.get_http_version()
        extensions = {
            "http_version": _VERSIONS.get(version) or b"HTTP/" + version.encode("ascii"),
            "reason_phrase": answer.reason,
        }
        if not answer.complete:
            return httpx.Response(
                status_code=answer.status,
                headers=answer.headers,
                stream=body,
                extensions=extensions,
            )
        body.finish()  # the whole answer is in: the connection can serve another now
        content = b"".join(answer.body)
        response = httpx.Response(
            status_code=answer.status,
            headers=answer.headers,
            stream=httpx.ByteStream(content),
            extensions=extensions,
        )
        return response

    async def aclose(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._open -= self._idle_count
        self._idle.clear()
        self._idle_count = 0
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.future.done():
                waiter.future.set_exception(RuntimeError("the transport is closed"))

    # --- the pool ---------------------------------------------------------------------------

    async def _acquire(
        self, origin: Origin, timeouts: Mapping[str, float | None], request: httpx.Request
    ) -> _Connection:
        loop = asyncio.get_running_loop()
        now = loop.time()
        idle = self._idle.get(origin)
        while idle:
            connection = idle.pop()
            self._idle_count -= 1
            if self._fresh(connection, now) and connection.usable(now):
                return connection
            self.discard(connection)
        limit = self._max_connections
        if limit is not None and self._open >= limit:
            if self._idle_count:  # an idle connection elsewhere gives its place up
                self._close_oldest_idle()
            else:
                handed = await self._wait_for_slot(origin, timeouts.get("pool"), request)
                if handed is not None:
                    return handed
                return await self._connect_counted(origin, timeouts.get("connect"), request)
        self._open += 1
        return await self._connect_counted(origin, timeouts.get("connect"), request)

    async def _connect_counted(
        self, origin: Origin, seconds: float | None, request: httpx.Request
    ) -> _Connection:
        """Open a connection for a place already counted in `_open` (given back on failure)."""
        try:
            return await self._connect(origin, seconds, request)
        except BaseException:
            self._free_slot()
            raise

    async def _wait_for_slot(
        self, origin: Origin, seconds: float | None, request: httpx.Request
    ) -> _Connection | None:
        """Wait for a place in the pool: an idle connection to `origin` handed over, or None:
        a place counted for this request, to connect in."""
        loop = asyncio.get_running_loop()
        waiter = _SlotWaiter(origin, loop.create_future())
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(seconds):
                return await waiter.future
        except BaseException as ended:  # timed out, cancelled
            future = waiter.future
            if future.done() and not future.cancelled() and future.exception() is None:
                handed = future.result()  # granted just as the wait ended: give it back
                if handed is not None:
                    self._put_back(origin, handed)
                else:
                    self._free_slot()
            if isinstance(ended, TimeoutError):
                raise httpx.PoolTimeout(
                    "timed out waiting for a connection", request=request
                ) from None
            raise
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    async def _connect(
        self, origin: Origin, seconds: float | None, request: httpx.Request
    ) -> _Connection:
        scheme, host, port, sni = origin
        loop = asyncio.get_running_loop()
        tls = scheme == "https"
        try:
            async with asyncio.timeout(seconds):
                addresses = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
                # The host's addresses raced (RFC 8305), as asyncio's own create_connection
                # does with happy_eyeballs_delay, but on any event loop: aiohttp's library.
                sock = await aiohappyeyeballs.start_connection(
                    addresses, happy_eyeballs_delay=_HAPPY_EYEBALLS_DELAY, interleave=1
                )
                try:
                    _, connection = await loop.create_connection(
                        _Connection,
                        sock=sock,
                        ssl=self._tls if tls else None,
                        server_hostname=sni if tls else None,
                        # The event loop's own 60 s default would end a longer `seconds` early.
                        ssl_handshake_timeout=(None if seconds is None else seconds + 1.0)
                        if tls
                        else None,
                    )
                except BaseException:
                    # No transport kept the socket (the TLS handshake failed, time ran out).
                    # (Closing one a failed transport already closed does nothing.)
                    sock.close()
                    raise
        except TimeoutError as exc:  # before OSError: TimeoutError is one
            raise httpx.ConnectTimeout(str(exc) or "timed out connecting", request=request) from exc
        except OSError as exc:  # ssl.SSLError (a refused certificate) is one
            raise httpx.ConnectError(str(exc), request=request) from exc
        return connection

    def _fresh(self, connection: _Connection, now: float) -> bool:
        return self._expiry is None or now - connection.idle_since <= self._expiry

    def release(self, origin: Origin, connection: _Connection, reusable: bool) -> None:
        """An exchange ended: its connection goes back to the pool, or is closed."""
        if reusable and not self._closed and connection.usable(connection.loop.time()):
            self._put_back(origin, connection)
        else:
            self.discard(connection)

    def _put_back(self, origin: Origin, connection: _Connection) -> None:
        for waiter in self._waiters:  # a request waiting for this origin takes it over
            if waiter.origin == origin and not waiter.future.done():
                waiter.future.set_result(connection)
                return
        if self._waiters or (self._max_idle is not None and self._idle_count >= self._max_idle):
            self.discard(connection)  # its place goes to a waiter for another origin
            return
        now = connection.loop.time()
        connection.idle_since = now
        self._idle.setdefault(origin, []).append(connection)
        self._idle_count += 1
        if now - self._swept_at > _SWEEP_SECONDS:
            self._sweep(now)

    def discard(self, connection: _Connection) -> None:
        """Close a connection that is not on the idle lists (in use, or just taken off them)
        and free its place: to a request waiting for one, or in the count."""
        connection.close()
        self._free_slot()

    def _free_slot(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.future.done():
                waiter.future.set_result(None)  # the place passes to it
                return
        self._open -= 1

    def _close_oldest_idle(self) -> None:
        oldest: tuple[Origin, _Connection] | None = None
        for origin, idle in self._idle.items():
            if idle and (oldest is None or idle[0].idle_since < oldest[1].idle_since):
                oldest = (origin, idle[0])
        assert oldest is not None
        origin, connection = oldest
        self._idle[origin].remove(connection)
        self._idle_count -= 1
        connection.close()
        self._open -= 1

    def _sweep(self, now: float) -> None:
        self._swept_at = now
        for origin in list(self._idle):
            idle = self._idle[origin]
            keep = [c for c in idle if self._fresh(c, now) and not (c.eof or c.lost)]
            for connection in idle:
                if connection not in keep:
                    connection.close()
                    self._open -= 1
            self._idle_count -= len(idle) - len(keep)
            if keep:
                self._idle[origin] = keep
            else:
                del self._idle[origin]

    # --- one exchange -----------------------------------------------------------------------

    async def _write(
        self,
        connection: _Connection,
        request: httpx.Request,
        framing: _Framing,
        seconds: float | None,
    ) -> bool:
        """Send the request (`seconds`: the write timeout); False when the connection went
        away before all of it left (the answer may still be read)."""
        head, chunked, length = framing
        try:
            try:
                content = request.content  # a request of bytes is read when it is built
            except httpx.RequestNotRead:
                await self._write_stream(connection, request, framing, seconds)
                return True
            if length is not None and len(content) != length:
                raise httpx.LocalProtocolError(
                    "Content-Length does not match the body", request=request
                )
            if chunked and content:
                content = b"%x\r\n%b\r\n0\r\n\r\n" % (len(content), content)
            elif chunked:
                content = b"0\r\n\r\n"
            if len(head) + len(content) <= _COALESCE_BYTES:
                await self._send(connection, (head + content,), seconds, request)
            else:
                await self._send(connection, (head, content), seconds, request)
        except _WriteFailed:
            return False
        return True

    async def _write_stream(
        self,
        connection: _Connection,
        request: httpx.Request,
        framing: _Framing,
        seconds: float | None,
    ) -> None:
        head, chunked, length = framing
        stream = request.stream
        assert isinstance(stream, httpx.AsyncByteStream)
        pending = [head]
        size = len(head)
        sent = 0
        async for part in stream:
            if not part:
                continue
            sent += len(part)
            if length is not None and sent > length:
                raise httpx.LocalProtocolError(
                    "the body is longer than its Content-Length", request=request
                )
            if chunked:
                pending.append(b"%x\r\n" % len(part))
                pending.append(part)
                pending.append(b"\r\n")
            else:
                pending.append(part)
            size += len(part)
            if size >= _COALESCE_BYTES:
                await self._send(connection, pending, seconds, request)
                pending, size = [], 0
        if length is not None and sent != length:
            raise httpx.LocalProtocolError(
                "the body is shorter than its Content-Length", request=request
            )
        if chunked:
            pending.append(b"0\r\n\r\n")
        if pending:
            await self._send(connection, pending, seconds, request)

    @staticmethod
    async def _send(
        connection: _Connection,
        buffers: tuple[bytes, ...] | list[bytes],
        seconds: float | None,
        request: httpx.Request,
    ) -> None:
        transport = connection.transport
        if connection.lost or transport is None or transport.is_closing():
            raise _WriteFailed
        connection.active_at = connection.loop.time()
        if len(buffers) == 1:
            transport.write(buffers[0])
        else:
            for buffer in buffers:  # large: no copy to join them (3.11's writelines joins)
                transport.write(buffer)
        while connection.write_paused and not connection.lost:
            if not await _wait(False, connection, seconds):
                raise httpx.WriteTimeout("timed out writing", request=request)
        if connection.lost:
            raise _WriteFailed

    @staticmethod
    def feed(answer: _Answer, data: bytes) -> None:
        try:
            answer.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, httpx.HTTPError):
                raise cause from None
            raise httpx.RemoteProtocolError(str(exc), request=answer.request) from exc
        except httptools.HttpParserError as exc:
            if answer.complete:  # what follows the answer is not HTTP: the answer stands
                answer.extra = True
                return
            raise httpx.RemoteProtocolError(
                f"the server's answer is not valid HTTP/1.1: {exc}", request=answer.request
            ) from exc

    @staticmethod
    async def receive(
        connection: _Connection, seconds: float | None, request: httpx.Request
    ) -> bytes:
        """The next bytes received; b"" at the end of the stream."""
        while not connection.chunks:
            if connection.eof or connection.lost:
                if connection.error is not None:
                    raise httpx.ReadError(str(connection.error), request=request)
                return b""
            if not await _wait(True, connection, seconds):
                raise httpx.ReadTimeout("timed out reading", request=request)
        return connection.take()

    async def _read_head(
        self, connection: _Connection, answer: _Answer, seconds: float | None, written: bool
    ) -> None:
        received = 0  # bytes of an answer's head (and of 1xx answers before it) so far
        while not answer.head_done:
            try:
                data = await self.receive(connection, seconds, answer.request)
            except httpx.ReadError:
                if not written:
                    raise httpx.WriteError(
                        "the connection closed while the request was sent", request=answer.request
                    ) from None
                raise
            if not data:
                if not written:
                    raise httpx.WriteError(
                        "the connection closed while the request was sent", request=answer.request
                    )
                raise httpx.RemoteProtocolError(
                    "Server disconnected without sending a response.", request=answer.request
                )
            self.feed(answer, data)
            if not answer.head_done:
                received += len(data)
                if received > _MAX_HEAD_BYTES:
                    raise httpx.RemoteProtocolError(
                        "the server's answer has a head larger than 100 KiB",
                        request=answer.request,
                    )


class _Body(httpx.AsyncByteStream):
    """An answer's body as it arrives; at its end the connection goes back to the pool (or
    is closed); closed early, the connection is closed."""

    def __init__(
        self,
        transport: Http11Transport,
        origin: Origin,
        connection: _Connection,
        answer: _Answer,
        written: bool,
        seconds: float | None,
    ) -> None:
        self._transport = transport
        self._origin = origin
        self._connection: _Connection | None = connection
        self._answer = answer
        self._written = written
        self._seconds = seconds

    def finish(self) -> None:
        """The answer is complete: give the connection back, kept alive when both sides
        keep it."""
        connection, self._connection = self._connection, None
        if connection is None:
            return
        answer = self._answer
        reusable = self._written and not answer.until_eof and not answer.extra and answer.keep_alive
        answer.parser = None  # nothing more to parse (see _abandon)
        self._transport.release(self._origin, connection, reusable)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        answer = self._answer
        body = answer.body
        while True:
            while body:
                yield body.popleft()
            if answer.complete:
                self.finish()
                return
            connection = self._connection
            if connection is None:
                raise httpx.StreamClosed()
            try:
                data = await Http11Transport.receive(connection, self._seconds, answer.request)
                if data:
                    Http11Transport.feed(answer, data)
                elif answer.until_eof:
                    answer.complete = True
                else:
                    raise httpx.RemoteProtocolError(
                        "peer closed connection without sending complete message body",
                        request=answer.request,
                    )
            except BaseException:
                self._abandon()
                raise

    def _abandon(self) -> None:
        connection, self._connection = self._connection, None
        # The parser calls the answer's methods and the answer holds the parser: a cycle that
        # would keep the answer, its request and body alive until the garbage collector runs.
        self._answer.parser = None
        if connection is not None:
            self._transport.discard(connection)

    async def aclose(self) -> None:
        if self._answer.complete and not self._answer.body:
            self.finish()
        else:
            self._abandon()
