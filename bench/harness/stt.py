"""The fast fake speech-to-text provider that bench.transcription and bench.limits send to:
an OpenAI-compatible POST /v1/audio/transcriptions answering `{"text": "fake transcript"}`
at once, served from a process of its own (`python -m bench.harness.stt`), with the catalog
that routes the gateway's benchmark models to it and the multipart upload sent to both.

Why not the tests' fake: the ThreadingHTTPServer of testkit/fakes/openai_stt.py takes about
44 ms per answer on loopback (headers and body leave in two writes without TCP_NODELAY, so
Nagle waits for the client's delayed ACK), which would swamp a 2 ms budget. So this fake
parses just enough HTTP/1.1 (Content-Length or chunked bodies, keep-alive, 100-continue) and
multipart/form-data to check the key, the `file` part and the `model` field.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from types import MappingProxyType

import httpx

from bench.harness.load import LOOPBACK
from bench.harness.processes import REPO_ROOT, service, terminate
from testkit.catalog import FAKE_KEY_ENV, fake_endpoint
from testkit.fakes.openai_stt import API_KEY as FAKE_PROVIDER_KEY

BENCH_MODEL = "bench/fast"
UPSTREAM_MODEL = "ok"  # the fake provider's model that answers at once
PRICE_PER_SECOND = "0.0001"
AUDIO_NAME = "hello"  # testkit/fixtures/hello.wav, 1.07 s
TRANSCRIPT = "fake transcript"
ROUTE = "/audio/transcriptions"  # under each base URL (…/v1 direct, …/api/v1 gateway)

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
            [sys.executable, "-m", "bench.harness.stt"],
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
        if self.process is not None and not terminate(self.process, grace):
            self.process.kill()
            self.process.wait()


def running_fake_provider() -> contextlib.AbstractContextManager[FakeProviderProcess]:
    """The fast fake provider for the length of a `with` block."""
    return service(FakeProviderProcess(api_key=FAKE_PROVIDER_KEY), "the fake provider", tail=20)


def main() -> int:
    """The fake provider's own process: serve until SIGTERM."""
    api_key = os.environ.get(FAKE_KEY_ENV)
    if not api_key:
        print(f"bench.harness.stt: error: {FAKE_KEY_ENV} is not set", file=sys.stderr)
        return 2
    asyncio.run(serve_fake_provider(api_key))
    return 0


# --- catalog and upload ---------------------------------------------------------------------


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


if __name__ == "__main__":
    sys.exit(main())
