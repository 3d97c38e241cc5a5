"""The load: a bounded run of concurrent requests and its percentiles, and the clients that
send them to 127.0.0.1 (the lean keep-alive HTTP/1.1 client, and httpx)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

LOOPBACK = "127.0.0.1"
REQUEST_TIMEOUT = 10.0  # seconds, per request

# One request: returns None on success, otherwise a short description of the failure.
Call = Callable[[], Awaitable[str | None]]


# --- measurement ----------------------------------------------------------------------------


@dataclass
class CaseResult:
    path: str
    concurrency: int
    target_requests: int
    requests: int  # completed (successful + failed)
    errors: int
    seconds: float
    requests_per_second: float
    p50_ms: float | None
    p99_ms: float | None
    hit_time_cap: bool
    error_kinds: dict[str, int] = field(default_factory=dict)


@dataclass
class _Tally:
    latencies_ms: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    issued: int = 0

    @property
    def completed(self) -> int:
        return len(self.latencies_ms) + self.errors.total()


def percentile(sorted_values: Sequence[float], pct: float) -> float | None:
    """Nearest-rank percentile of already sorted values."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(pct / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def round_ms(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


async def _drive(
    call: Call, concurrency: int, total: int, time_cap: float
) -> tuple[_Tally, float, bool]:
    """Issue `total` requests from `concurrency` workers, stopping at `time_cap` seconds."""
    tally = _Tally()
    deadline = time.perf_counter() + time_cap

    async def worker() -> None:
        while tally.issued < total and time.perf_counter() < deadline:
            tally.issued += 1
            started = time.perf_counter()
            try:
                failure = await call()
            except Exception as exc:
                failure = type(exc).__name__
            elapsed_ms = (time.perf_counter() - started) * 1000
            if failure is None:
                tally.latencies_ms.append(elapsed_ms)
            else:
                tally.errors[failure] += 1

    started = time.perf_counter()
    hit_cap = False
    try:
        # The hard cap also cuts off requests still in flight when it expires.
        async with asyncio.timeout(time_cap):
            await asyncio.gather(*(worker() for _ in range(concurrency)))
    except TimeoutError:
        hit_cap = True
    seconds = time.perf_counter() - started
    hit_cap = hit_cap or tally.completed < total
    return tally, seconds, hit_cap


async def measure(
    path: str, call: Call, concurrency: int, total: int, warmup: int, time_cap: float
) -> CaseResult:
    """A warm-up of `warmup` requests (not measured), then `total` requests from
    `concurrency` workers, cut off after `time_cap` seconds."""
    if warmup > 0:
        await _drive(call, concurrency, warmup, min(time_cap, 10.0))
    tally, seconds, hit_cap = await _drive(call, concurrency, total, time_cap)
    latencies = sorted(tally.latencies_ms)
    completed = tally.completed
    return CaseResult(
        path=path,
        concurrency=concurrency,
        target_requests=total,
        requests=completed,
        errors=tally.errors.total(),
        seconds=round(seconds, 3),
        requests_per_second=round(completed / seconds, 1) if seconds > 0 else 0.0,
        p50_ms=round_ms(percentile(latencies, 50)),
        p99_ms=round_ms(percentile(latencies, 99)),
        hit_time_cap=hit_cap,
        error_kinds=dict(tally.errors),
    )


# --- httpx ----------------------------------------------------------------------------------

HTTPX_DEFAULT_POOL = httpx.Limits(max_connections=100, max_keepalive_connections=20)  # httpx's


def loopback_client(
    base_url: str = "",
    headers: Mapping[str, str] | None = None,
    concurrency: int | None = None,
) -> httpx.AsyncClient:
    """An httpx client for 127.0.0.1: HTTP/1.1, the per-request timeout, no proxies from the
    environment; with `concurrency`, a pool of that many kept-alive connections."""
    pool = HTTPX_DEFAULT_POOL
    if concurrency is not None:
        pool = httpx.Limits(
            max_connections=concurrency,
            max_keepalive_connections=concurrency,
            keepalive_expiry=60.0,
        )
    return httpx.AsyncClient(
        base_url=base_url,
        headers=headers,
        limits=pool,
        http1=True,
        http2=False,
        timeout=REQUEST_TIMEOUT,
        trust_env=False,  # no proxies from the environment: talk to 127.0.0.1 only
    )


def bearer(key: str, content_type: str | None = None) -> dict[str, str]:
    """Request headers with an API key (and a Content-Type)."""
    headers = {"Authorization": f"Bearer {key}"}
    if content_type is not None:
        headers["Content-Type"] = content_type
    return headers


# --- the lean client ------------------------------------------------------------------------


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """Read one HTTP/1.1 response off `reader`: (status, connection reusable)."""
    while True:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head[:-4].split(b"\r\n")
        status_line = lines[0].split(b" ", 2)
        if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/1."):
            raise ConnectionError("malformed status line")
        status = int(status_line[1])
        if status >= 200:
            break  # 1xx responses (100 Continue) precede the real one
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    reusable = b"close" not in headers.get(b"connection", b"").lower()
    if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass  # trailers
                break
            await reader.readexactly(size + 2)
    elif b"content-length" in headers:
        await reader.readexactly(int(headers[b"content-length"]))
    else:
        await reader.read()  # delimited by the end of the connection
        reusable = False
    return status, reusable


class LeanHttpClient:
    """A minimal keep-alive HTTP/1.1 client for pre-encoded POSTs (or bodiless GETs): the
    requests are built once and each call costs a write and a parse of the response head, so
    the load generator's CPU stays small next to the servers'. Each call sends the next request in
    turn (one per API key given, each with the `headers` given). Connections are opened on
    demand, at most one per concurrent call, and reused; one that fails or is cut off is
    closed."""

    def __init__(
        self,
        url: str,
        keys: Sequence[str],
        content_type: str,
        body: bytes,
        method: str = "POST",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname != LOOPBACK or parts.port is None:
            raise ValueError(f"the lean client only talks plain HTTP to {LOOPBACK}: {url}")
        if not keys:
            raise ValueError("the lean client needs at least one API key")
        self._port = parts.port
        # A GET carries no body, so no Content-Type or Content-Length either.
        entity = (
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            if method != "GET"
            else ""
        )
        # More headers, sent as given (a proxy's routing headers: Portkey's x-portkey-*).
        more = dict(headers or {})
        if any("\r" in text or "\n" in text for item in more.items() for text in item):
            raise ValueError("a header name or value holds a line break")
        extra = "".join(f"{name}: {value}\r\n" for name, value in more.items())
        self._requests = [
            (
                f"{method} {parts.path} HTTP/1.1\r\n"
                f"Host: {LOOPBACK}:{parts.port}\r\n"
                f"Authorization: Bearer {key}\r\n"
                f"{entity}"
                f"{extra}"
                "Accept: application/json\r\n"
                "\r\n"
            ).encode("latin-1")
            + (body if method != "GET" else b"")
            for key in keys
        ]
        self._sent = 0
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def __aenter__(self) -> LeanHttpClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def post(self) -> int:
        """Send the next request; the response status."""
        request = self._requests[self._sent % len(self._requests)]
        self._sent += 1
        connection = self._idle.pop() if self._idle else None
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT):
                if connection is None:
                    connection = await asyncio.open_connection(LOOPBACK, self._port)
                reader, writer = connection
                writer.write(request)
                status, reusable = await _read_response(reader)
        except BaseException:
            if connection is not None:
                connection[1].close()
            raise
        if reusable:
            self._idle.append((reader, writer))
        else:
            writer.close()
        return status

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()
        for _, writer in idle:
            with contextlib.suppress(OSError):
                await writer.wait_closed()


def lean_call(client: LeanHttpClient) -> Call:
    async def call() -> str | None:
        status = await client.post()
        return None if status == 200 else f"HTTP {status}"

    return call
