"""Benchmark POST /api/v1/audio/transcriptions: the latency the gateway adds to a provider call.

Starts a fast fake OpenAI-compatible transcription provider (an asyncio HTTP/1.1 server in a
process of its own, answering `{"text": "fake transcript"}` at once), writes a catalog with one
model, `bench/fast`, served by it, starts its own gateway (`gateway up`, gRPC server + Envoy)
on a fresh temporary data dir, issues an API key with `gateway keys create` and funds its
account with `gateway credits add`. Then, for each concurrency, it sends the same multipart
request (file=hello.wav, model) (a) directly to the fake provider and (b) through the
gateway's REST facade: a short warm-up, then a bounded run (a fixed number of requests, cut
off by a hard time cap). Every response must be HTTP 200; anything else is counted as an
error. Latency percentiles are over the successful requests; the added latency is the
gateway's p50 minus the direct p50 at the same concurrency. Only 127.0.0.1 is contacted.

The issue's targets are reported, met or not, without failing the run: added p50 <= 2 ms at
concurrency 1, and >= 1000 req/s through the gateway at concurrency 16.

Why not the tests' fake and httpx: the ThreadingHTTPServer of tests/fakes/openai_stt.py takes
about 44 ms per answer on loopback (headers and body leave in two writes without TCP_NODELAY,
so Nagle waits for the client's delayed ACK), which would swamp a 2 ms budget; and httpx costs
~0.8 ms of client CPU per request and reaches only ~600 req/s at concurrency 16 against a fake
that answers in 0.1 ms. So the fake here parses just enough HTTP/1.1 (Content-Length or
chunked bodies, keep-alive, 100-continue) and multipart/form-data to check the key, the `file`
part and the `model` field, and the load generator is a minimal keep-alive HTTP/1.1 client
sending the pre-encoded request (`--client httpx` measures with httpx instead). Each path is
first checked once with httpx, including that the gateway billed the request.

Run from the repository root:

    python -m bench.transcription                         # SQLite in the temp data dir
    python -m bench.transcription --database-url postgresql://postgres@127.0.0.1:5432/test
    python -m bench.transcription --database-url postgresql --requests 300 --json out.json
    python -m bench.transcription --workers 2             # `gateway up --workers 2`

With --database-url the URL names a PostgreSQL server and a database to connect to for
administration (`postgresql` alone means postgresql://postgres@127.0.0.1:5432/test); a fresh
database is created there for the run and dropped at the end. With --workers N the gateway
runs N server processes behind one Envoy. The peak RSS (VmHWM) of the gateway's processes is
read before it is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from http import HTTPStatus
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

import httpx

from bench.common import (
    LOOPBACK,
    REPO_ROOT,
    REQUEST_TIMEOUT,
    Call,
    CaseResult,
    PeakRss,
    PgServer,
    add_gateway_arguments,
    add_load_arguments,
    exit_on_sigterm,
    fmt,
    gateway_cli,
    machine_info,
    measure,
    positive_int,
    run_database,
    running,
)
from tests.fakes.openai_stt import API_KEY as FAKE_PROVIDER_KEY
from tests.support.audio import fixture
from tests.support.catalog import FAKE_KEY_ENV, fake_endpoint
from tests.support.processes import GatewayProcess

DIRECT_PATH = "direct to fake provider"
GATEWAY_PATH = "REST POST /api/v1/audio/transcriptions (Envoy)"
BENCH_MODEL = "bench/fast"
UPSTREAM_MODEL = "ok"  # the fake provider's model that answers at once
PRICE_PER_SECOND = "0.0001"
CREDITS_USD = "100000"
AUDIO_NAME = "hello"  # tests/fixtures/hello.wav, 1.07 s
TRANSCRIPT = "fake transcript"
ROUTE = "/audio/transcriptions"  # under each base URL (…/v1 direct, …/api/v1 gateway)

# The targets: reported, never a failure.
TARGET_ADDED_P50_MS = 2.0
TARGET_ADDED_P50_CONCURRENCY = 1
TARGET_RPS = 1000.0
TARGET_RPS_CONCURRENCY = 16


# --- the fast fake provider -----------------------------------------------------------------

FAKE_ROUTE = b"/v1/audio/transcriptions"
FAKE_READY = "Fake provider listening on"
MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 30 * 1000 * 1000
_BOUNDARY = re.compile(rb'boundary="?([^";\s]+)"?', re.IGNORECASE)
_PART_NAME = re.compile(rb'(?:^|[;\s])name="([^"]*)"', re.IGNORECASE)


class _BadRequest(ValueError):
    """The bytes are not HTTP/1.1 this fake understands: answered with 400, then closed."""


def _response(
    status: int,
    reason: str,
    body: bytes,
    *,
    close: bool = False,
    content_type: str = "application/json",
) -> bytes:
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
    )
    if close:
        head += "Connection: close\r\n"
    return head.encode("latin-1") + b"\r\n" + body


def _error(status: int, message: str, code: str = "invalid_request_error", *, close: bool) -> bytes:
    """An error in OpenAI's shape."""
    body = {"error": {"message": message, "type": code, "code": code}}
    return _response(status, HTTPStatus(status).phrase, json.dumps(body).encode(), close=close)


_TRANSCRIPT_BODY = json.dumps({"text": TRANSCRIPT}).encode()
_OK = {close: _response(200, "OK", _TRANSCRIPT_BODY, close=close) for close in (False, True)}
_OK_TEXT = {
    close: _response(200, "OK", TRANSCRIPT.encode(), close=close, content_type="text/plain")
    for close in (False, True)
}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


@dataclass
class _Head:
    end: int  # offset of the body in the buffer
    method: bytes
    target: bytes
    headers: dict[bytes, bytes]
    keep_alive: bool
    continued: bool = False  # "100 Continue" already sent


@dataclass(frozen=True)
class _Request:
    method: bytes
    target: bytes
    headers: dict[bytes, bytes]
    body: bytes
    keep_alive: bool


def _parse_head(buffer: bytearray) -> _Head | None:
    head_end = buffer.find(b"\r\n\r\n")
    if head_end < 0:
        if len(buffer) > MAX_HEAD_BYTES:
            raise _BadRequest("request head too large")
        return None
    lines = bytes(buffer[:head_end]).split(b"\r\n")
    request_line = lines[0].split(b" ")
    if len(request_line) != 3 or not request_line[2].startswith(b"HTTP/1."):
        raise _BadRequest("malformed request line")
    method, target, version = request_line
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip():
            raise _BadRequest("malformed header line")
        headers[name.lower()] = value.strip()
    connection = headers.get(b"connection", b"").lower()
    if version == b"HTTP/1.0":
        keep_alive = b"keep-alive" in connection
    else:
        keep_alive = b"close" not in connection
    return _Head(head_end + 4, method, target, headers, keep_alive)


def _dechunk(buffer: bytearray, start: int) -> tuple[bytes, int] | None:
    """A chunked body starting at `start`: (body, offset after it), or None if incomplete."""
    body = bytearray()
    position = start
    while True:
        line_end = buffer.find(b"\r\n", position)
        if line_end < 0:
            return None
        try:
            size = int(bytes(buffer[position:line_end]).split(b";", 1)[0], 16)
        except ValueError as exc:
            raise _BadRequest("malformed chunk size") from exc
        position = line_end + 2
        if size == 0:
            while True:  # optional trailers, then an empty line
                line_end = buffer.find(b"\r\n", position)
                if line_end < 0:
                    return None
                if line_end == position:
                    return bytes(body), position + 2
                position = line_end + 2
        if len(body) + size > MAX_BODY_BYTES:
            raise _BadRequest("body too large")
        if len(buffer) < position + size + 2:
            return None
        body += buffer[position : position + size]
        position += size + 2


def _multipart(body: bytes, boundary: bytes) -> tuple[dict[str, str], int]:
    """The form fields of a multipart/form-data body and the size of its `file` part."""
    fields: dict[str, str] = {}
    file_bytes = 0
    for part in body.split(b"--" + boundary)[1:]:
        if part.startswith(b"--"):
            break  # the closing delimiter
        head, separator, data = part.partition(b"\r\n\r\n")
        if not separator:
            raise _BadRequest("malformed multipart part")
        if data.endswith(b"\r\n"):
            data = data[:-2]
        name = None
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-disposition:"):
                match = _PART_NAME.search(line)
                name = match.group(1).decode() if match else None
        if name == "file":
            file_bytes = len(data)
        elif name:
            fields[name] = data.decode("utf-8", "replace")
    return fields, file_bytes


class FakeProviderProtocol(asyncio.Protocol):
    """One connection to the fake provider: HTTP/1.1 requests in, answers out, in order."""

    def __init__(self, api_key: str) -> None:
        self._authorization = f"Bearer {api_key}".encode()
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._head: _Head | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while self._transport is not None:
            try:
                request = self._next_request()
            except _BadRequest as error:
                self._transport.write(_error(400, str(error), close=True))
                self._transport.close()
                return
            if request is None:
                return
            self._transport.write(self._answer(request))
            if not request.keep_alive:
                self._transport.close()
                return

    def _next_request(self) -> _Request | None:
        if self._head is None:
            self._head = _parse_head(self._buffer)
            if self._head is None:
                return None
        head = self._head
        if b"chunked" in head.headers.get(b"transfer-encoding", b"").lower():
            decoded = _dechunk(self._buffer, head.end)
        else:
            try:
                length = int(head.headers.get(b"content-length", b"0"))
            except ValueError as exc:
                raise _BadRequest("malformed Content-Length") from exc
            if not 0 <= length <= MAX_BODY_BYTES:
                raise _BadRequest("bad Content-Length")
            decoded = None
            if len(self._buffer) >= head.end + length:
                decoded = (bytes(self._buffer[head.end : head.end + length]), head.end + length)
        if decoded is None:
            expects = head.headers.get(b"expect", b"").lower() == b"100-continue"
            if expects and not head.continued and self._transport is not None:
                self._transport.write(_CONTINUE)
                head.continued = True
            return None
        body, end = decoded
        del self._buffer[:end]
        self._head = None
        return _Request(head.method, head.target, head.headers, body, head.keep_alive)

    def _answer(self, request: _Request) -> bytes:
        close = not request.keep_alive
        if request.target.split(b"?", 1)[0] != FAKE_ROUTE:
            return _error(404, "not found", "not_found", close=close)
        if request.method != b"POST":
            return _error(405, "use POST", close=close)
        if request.headers.get(b"authorization") != self._authorization:
            return _error(401, "bad key", "invalid_api_key", close=close)
        content_type = request.headers.get(b"content-type", b"")
        boundary = _BOUNDARY.search(content_type)
        if not content_type.lower().startswith(b"multipart/form-data") or boundary is None:
            return _error(400, "expected multipart/form-data", close=close)
        fields, file_bytes = _multipart(request.body, boundary.group(1))
        if file_bytes == 0:
            return _error(400, "file is required", close=close)
        model = fields.get("model", "")
        if model != UPSTREAM_MODEL:
            return _error(404, f"model {model} not found", "model_not_found", close=close)
        if fields.get("response_format") == "text":
            return _OK_TEXT[close]
        return _OK[close]


async def serve_fake_provider(api_key: str) -> None:
    """Serve on a free port of 127.0.0.1 until SIGTERM or SIGINT; announce the port first."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    server = await loop.create_server(
        lambda: FakeProviderProtocol(api_key), LOOPBACK, 0, backlog=1024
    )
    port = server.sockets[0].getsockname()[1]
    print(f"{FAKE_READY} {LOOPBACK}:{port}", flush=True)
    async with server:
        await stop.wait()


@dataclass
class FakeProviderProcess:
    """The fake provider in a process of its own, so it never competes with the load
    generator's event loop (or GIL)."""

    api_key: str
    port: int | None = None
    process: subprocess.Popen[str] | None = None
    output: list[str] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        assert self.port is not None
        return f"http://{LOOPBACK}:{self.port}/v1"

    def start(self, ready_within: float = 30.0) -> FakeProviderProcess:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.transcription", "--serve-fake-provider"],
            cwd=REPO_ROOT,
            env={**os.environ, FAKE_KEY_ENV: self.api_key},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        ready = threading.Event()

        def pump() -> None:
            assert self.process is not None and self.process.stdout is not None
            for line in self.process.stdout:
                self.output.append(line)
                if line.startswith(FAKE_READY):
                    self.port = int(line.rsplit(":", 1)[1])
                    ready.set()

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + ready_within
        while not ready.wait(0.1):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("fake provider did not start:\n" + "".join(self.output))
        return self

    def stop(self, grace: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(grace)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@contextlib.contextmanager
def running_fake_provider() -> Iterator[FakeProviderProcess]:
    """The fast fake provider for the length of a run; the end of its output if anything
    failed."""
    fake = FakeProviderProcess(api_key=FAKE_PROVIDER_KEY)
    print("Starting the fake provider...", file=sys.stderr, flush=True)
    try:
        fake.start()
        yield fake
    except Exception:
        print(f"Fake provider output (last lines):\n{''.join(fake.output[-20:])}", file=sys.stderr)
        raise
    finally:
        fake.stop()


def run_fake_provider() -> int:
    api_key = os.environ.get(FAKE_KEY_ENV)
    if not api_key:
        print(f"transcription: error: {FAKE_KEY_ENV} is not set", file=sys.stderr)
        return 2
    asyncio.run(serve_fake_provider(api_key))
    return 0


# --- catalog, key and credits ---------------------------------------------------------------


def write_catalog(
    path: Path,
    provider_base_url: str,
    prices: Mapping[str, str] = MappingProxyType({BENCH_MODEL: PRICE_PER_SECOND}),
) -> Path:
    """A catalog of speech-to-text models (id -> USD per second), all on the fake provider."""
    lines: list[str] = []
    for model_id, price_per_second in prices.items():
        lines += [
            "[[models]]",
            f'id = "{model_id}"',
            'name = "Benchmark: fast fake provider"',
            'kind = "stt"',
            f'price_per_second = "{price_per_second}"',
            "[[models.endpoints]]",
            fake_endpoint(provider_base_url, UPSTREAM_MODEL, "benchfake"),
        ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def create_funded_key(data_dir: Path, database_url: str) -> str:
    key = gateway_cli(data_dir, database_url, "keys", "create", "--name", "bench")
    gateway_cli(data_dir, database_url, "credits", "add", "--amount", CREDITS_USD)
    return key.strip().splitlines()[-1].strip()


# --- the two paths --------------------------------------------------------------------------


@dataclass(frozen=True)
class Upload:
    """One multipart/form-data request body, encoded once and sent as is."""

    content: bytes
    content_type: str


def multipart_upload(model: str, audio: bytes) -> Upload:
    request = httpx.Request(
        "POST",
        f"http://{LOOPBACK}/",
        data={"model": model},
        files={"file": (f"{AUDIO_NAME}.wav", audio, "audio/wav")},
    )
    return Upload(request.read(), request.headers["Content-Type"])


@dataclass(frozen=True)
class Destination:
    """Where one path is sent: base URL, bearer key and the body to post."""

    path: str
    base_url: str
    key: str
    upload: Upload


def _httpx_client(target: Destination, concurrency: int) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=target.base_url,
        headers={
            "Authorization": f"Bearer {target.key}",
            "Content-Type": target.upload.content_type,
        },
        limits=httpx.Limits(
            max_connections=concurrency,
            max_keepalive_connections=concurrency,
            keepalive_expiry=60.0,
        ),
        http1=True,
        http2=False,
        timeout=REQUEST_TIMEOUT,
        trust_env=False,  # no proxies from the environment: talk to 127.0.0.1 only
    )


def _httpx_call(client: httpx.AsyncClient, upload: Upload) -> Call:
    async def call() -> str | None:
        response = await client.post(ROUTE, content=upload.content)
        return None if response.status_code == 200 else f"HTTP {response.status_code}"

    return call


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
    """A minimal keep-alive HTTP/1.1 client for pre-encoded POSTs: the requests are built
    once and each call costs a write and a parse of the response head, so the load
    generator's CPU stays small next to the servers'. Each call sends the next request in
    turn (one per API key given). Connections are opened on demand, at most one per
    concurrent call, and reused; one that fails or is cut off is closed."""

    def __init__(self, url: str, keys: Sequence[str], content_type: str, body: bytes) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname != LOOPBACK or parts.port is None:
            raise ValueError(f"the lean client only talks plain HTTP to {LOOPBACK}: {url}")
        if not keys:
            raise ValueError("the lean client needs at least one API key")
        self._port = parts.port
        self._requests = [
            (
                f"POST {parts.path} HTTP/1.1\r\n"
                f"Host: {LOOPBACK}:{parts.port}\r\n"
                f"Authorization: Bearer {key}\r\n"
                f"Content-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\n"
                "Accept: application/json\r\n"
                "\r\n"
            ).encode("latin-1")
            + body
            for key in keys
        ]
        self._sent = 0
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    @classmethod
    def for_target(cls, target: Destination) -> LeanHttpClient:
        """The transcription upload of one path, with its key."""
        return cls(
            target.base_url + ROUTE, [target.key], target.upload.content_type, target.upload.content
        )

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


async def preflight(target: Destination) -> None:
    """One request per path through httpx, so a broken setup fails loudly instead of as 100%
    errors, and the answer is checked by an independent client."""
    async with _httpx_client(target, 1) as client:
        response = await client.post(ROUTE, content=target.upload.content)
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code != 200 or not isinstance(body, dict):
        raise RuntimeError(
            f"{target.path} preflight failed: {response.status_code} {response.text}"
        )
    if body.get("text") != TRANSCRIPT:
        raise RuntimeError(f"{target.path} preflight: unexpected answer {response.text}")
    usage = body.get("usage")
    if target.path == GATEWAY_PATH and not (isinstance(usage, dict) and usage.get("cost")):
        raise RuntimeError(f"{target.path} preflight: the request was not billed: {response.text}")
    async with LeanHttpClient.for_target(target) as lean:
        status = await lean.post()
        if status != 200:
            raise RuntimeError(f"{target.path} preflight (lean client) failed: HTTP {status}")


async def _measure_one(
    target: Destination, concurrency: int, args: argparse.Namespace
) -> CaseResult:
    def run(call: Call) -> Awaitable[CaseResult]:
        return measure(target.path, call, concurrency, args.requests, args.warmup, args.time_cap)

    if args.client == "httpx":
        async with _httpx_client(target, concurrency) as client:
            return await run(_httpx_call(client, target.upload))
    async with LeanHttpClient.for_target(target) as lean:
        return await run(lean_call(lean))


async def run_cases(
    fake: FakeProviderProcess, gateway: GatewayProcess, key: str, args: argparse.Namespace
) -> list[CaseResult]:
    audio = fixture(AUDIO_NAME)
    direct = Destination(
        DIRECT_PATH, fake.base_url, fake.api_key, multipart_upload(UPSTREAM_MODEL, audio)
    )
    through = Destination(GATEWAY_PATH, gateway.base_url, key, multipart_upload(BENCH_MODEL, audio))
    for target in (direct, through):
        await preflight(target)
    results: list[CaseResult] = []
    for concurrency in args.concurrency:
        for target in (direct, through):
            results.append(await _measure_one(target, concurrency, args))
            _progress(results[-1])
    return results


def _progress(result: CaseResult) -> None:
    print(
        f"  done: {result.path}, concurrency {result.concurrency}: "
        f"{result.requests_per_second} req/s, p50 {result.p50_ms} ms",
        file=sys.stderr,
        flush=True,
    )


# --- report ---------------------------------------------------------------------------------


def _case(results: Sequence[CaseResult], path: str, concurrency: int) -> CaseResult | None:
    return next((r for r in results if r.path == path and r.concurrency == concurrency), None)


def added_p50(results: Sequence[CaseResult], concurrency: int) -> float | None:
    """The gateway's p50 minus the direct p50, at one concurrency."""
    direct = _case(results, DIRECT_PATH, concurrency)
    through = _case(results, GATEWAY_PATH, concurrency)
    if direct is None or through is None or direct.p50_ms is None or through.p50_ms is None:
        return None
    return round(through.p50_ms - direct.p50_ms, 2)


@dataclass(frozen=True)
class TargetCheck:
    name: str
    value: float | None  # None: not measured at that concurrency
    met: bool | None

    def line(self, unit: str) -> str:
        if self.value is None or self.met is None:
            return f"- {self.name}: not measured"
        return f"- {self.name}: {self.value:.2f} {unit}, {'met' if self.met else 'NOT met'}"


def target_checks(results: Sequence[CaseResult]) -> tuple[TargetCheck, TargetCheck]:
    added = added_p50(results, TARGET_ADDED_P50_CONCURRENCY)
    latency = TargetCheck(
        f"added p50 <= {TARGET_ADDED_P50_MS:g} ms at concurrency {TARGET_ADDED_P50_CONCURRENCY}",
        added,
        None if added is None else added <= TARGET_ADDED_P50_MS,
    )
    through = _case(results, GATEWAY_PATH, TARGET_RPS_CONCURRENCY)
    rps: float | None = None
    rps_met: bool | None = None
    if through is not None:
        rps = through.requests_per_second
        rps_met = rps >= TARGET_RPS and through.errors == 0  # errors do not count as served
    throughput = TargetCheck(
        f">= {TARGET_RPS:g} req/s through the gateway at concurrency {TARGET_RPS_CONCURRENCY}",
        rps,
        rps_met,
    )
    return latency, throughput


def markdown_table(results: Sequence[CaseResult]) -> str:
    rows = [
        "| path | concurrency | requests | req/s | p50 ms | p99 ms | added p50 ms | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        requests = f"{r.requests}" + (" (time cap)" if r.hit_time_cap else "")
        added = added_p50(results, r.concurrency) if r.path == GATEWAY_PATH else None
        rows.append(
            f"| {r.path} | {r.concurrency} | {requests} | {r.requests_per_second:.1f} "
            f"| {fmt(r.p50_ms)} | {fmt(r.p99_ms)} | {fmt(added)} | {r.errors} |"
        )
    return "\n".join(rows)


def report(
    results: Sequence[CaseResult],
    machine: dict[str, Any],
    client: str,
    workers: int,
    rss: PeakRss | None,
) -> str:
    latency, throughput = target_checks(results)
    lines = [
        markdown_table(results),
        "",
        "Targets of the issue (reported, not enforced):",
        latency.line("ms"),
        throughput.line("req/s"),
        "",
        f"Machine: nproc={machine['nproc']}, CPU: {machine['cpu']}, "
        f"Python {machine['python']}, database: {machine['database']}, load generator: {client}",
        f"Gateway: {workers} server process(es) behind one Envoy",
    ]
    if rss is not None:
        lines.append(rss.line())
    for r in results:
        if r.error_kinds:
            kinds = ", ".join(f"{kind} x{count}" for kind, count in sorted(r.error_kinds.items()))
            lines.append(f"Errors in {r.path}, concurrency {r.concurrency}: {kinds}")
    return "\n".join(lines)


# --- main -----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.transcription",
        description="Benchmark the latency the gateway adds to POST /api/v1/audio/transcriptions: "
        "the same multipart upload sent directly to a fast fake provider and through a gateway "
        "started for the run.",
    )
    add_gateway_arguments(parser)
    add_load_arguments(parser, requests=1000, warmup=100)
    parser.add_argument(
        "--concurrency",
        type=positive_int,
        nargs="+",
        default=[1, 16],
        help="concurrency levels (1 16)",
    )
    parser.add_argument(
        "--client",
        choices=("lean", "httpx"),
        default="lean",
        help="load generator: a minimal keep-alive HTTP/1.1 client (lean, default) or httpx "
        "(as bench.key_status; its own CPU cost then limits the higher rates)",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write results as JSON")
    # Internal: the fake provider's own process (see FakeProviderProcess).
    parser.add_argument("--serve-fake-provider", action="store_true", help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.serve_fake_provider:
        return run_fake_provider()
    try:
        pg = PgServer.parse(args.database_url) if args.database_url else None
    except ValueError as error:
        print(f"transcription: error: {error}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, exit_on_sigterm)

    with tempfile.TemporaryDirectory(prefix="bench-transcription-") as tmp:
        data_dir = Path(tmp) / "data"
        data_dir.mkdir()
        with run_database(pg, data_dir) as database, running_fake_provider() as fake:
            catalog = write_catalog(Path(tmp) / "catalog.toml", fake.base_url)
            gateway = GatewayProcess(
                data_dir=data_dir,
                database_url=database.url,
                extra_env={"GATEWAY_CATALOG": str(catalog), FAKE_KEY_ENV: fake.api_key},
                extra_args=("--workers", str(args.workers)),
            )
            with running(gateway) as run:
                key = create_funded_key(data_dir, database.url)
                results = asyncio.run(run_cases(fake, gateway, key, args))

    machine = machine_info(database.label)
    print(report(results, machine, args.client, args.workers, run.peak_rss))
    if args.json is not None:
        latency, throughput = target_checks(results)
        payload = {
            "benchmark": "transcription",
            "settings": {
                "requests": args.requests,
                "warmup": args.warmup,
                "time_cap_seconds": args.time_cap,
                "concurrency": args.concurrency,
                "client": args.client,
                "workers": args.workers,
                "model": BENCH_MODEL,
                "audio": f"tests/fixtures/{AUDIO_NAME}.wav",
            },
            "machine": machine,
            "peak_rss": None if run.peak_rss is None else asdict(run.peak_rss),
            "results": [asdict(r) for r in results],
            "added_p50_ms": {str(c): added_p50(results, c) for c in args.concurrency},
            "targets": [asdict(latency), asdict(throughput)],
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return 1 if any(r.errors for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
