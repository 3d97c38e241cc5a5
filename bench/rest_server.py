"""The REST listener's HTTP/1.1 server, measured beside the one a gateway would write itself:
aiohttp's low-level server (server/rest/listener.py's choice) against a bare asyncio
protocol on httptools (llhttp's parser, as bench/floors.py's F3-http server), each answering
a 32 KB POST (read whole) with a small JSON body and nothing else.

Each server runs in a child process of its own on 127.0.0.1; this process sends the load
(keep-alive connections, one request at a time on each) and reads the server's CPU time
from /proc around each measurement. Rounds alternate between the two servers, so the drift
of a shared machine falls on both; each figure is the median of the rounds.

    python -m bench.rest_server                       # 5 rounds, concurrency 1 and 16
    python -m bench.rest_server --rounds 7 --requests 8000 --json out.json

Every load loop is bounded by its request count and a time cap; only the processes this run
started are stopped, by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

from bench.harness.cli import add_json_argument, positive_int

LOOPBACK = "127.0.0.1"
BODY = b"x" * 32_000
ANSWER = b'{"text":"hello world"}'
SERVERS = ("aiohttp", "httptools")
READY = "listening on"


# --- the servers (child processes) ---------------------------------------------------------


def _answer(body: bytes) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        % len(body)
    ) + body


class _BareProtocol(asyncio.Protocol):
    """What a gateway's own server would be: llhttp's callbacks, each request answered in a
    task of its own once its body is in."""

    def __init__(self) -> None:
        import httptools

        self._parser = httptools.HttpRequestParser(self)
        self._body = bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        body, self._body = bytes(self._body), bytearray()
        asyncio.get_running_loop().create_task(self._respond(body))

    async def _respond(self, body: bytes) -> None:
        assert self._transport is not None
        self._transport.write(_answer(ANSWER))


async def _serve(kind: str) -> None:
    loop = asyncio.get_running_loop()
    if kind == "httptools":
        listening = await loop.create_server(_BareProtocol, LOOPBACK, 0)
    else:
        from aiohttp import web

        async def handle(request: web.BaseRequest) -> web.Response:
            await request.content.read()
            return web.Response(body=ANSWER, content_type="application/json")

        listening = await loop.create_server(
            web.Server(handle, handler_cancellation=True, access_log=None), LOOPBACK, 0
        )
    print(f"{READY} {listening.sockets[0].getsockname()[1]}", flush=True)
    await asyncio.Event().wait()


# --- the load ------------------------------------------------------------------------------


async def _load(port: int, requests: int, concurrency: int, time_cap: float) -> int:
    """Send up to `requests` POSTs on `concurrency` keep-alive connections; how many were
    answered within `time_cap` seconds."""
    request = (
        b"POST /api/v1/audio/transcriptions HTTP/1.1\r\nHost: bench\r\n"
        b"Content-Type: audio/wav\r\nContent-Length: %d\r\n\r\n" % len(BODY)
    ) + BODY
    left = [requests]
    answered = [0]
    deadline = time.monotonic() + time_cap

    async def connection() -> None:
        reader, writer = await asyncio.open_connection(LOOPBACK, port)
        try:
            while left[0] > 0 and time.monotonic() < deadline:
                left[0] -= 1
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                await reader.readexactly(length)
                answered[0] += 1
        finally:
            writer.close()

    await asyncio.gather(*(connection() for _ in range(concurrency)))
    return answered[0]


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start(kind: str) -> tuple[subprocess.Popen[str], int]:
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.rest_server", "--serve", kind],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith(READY):
        process.kill()
        raise RuntimeError(f"the {kind} server did not start: {line!r}")
    return process, int(line.split()[-1])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.rest_server", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--serve", choices=SERVERS, help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=positive_int, default=5)
    parser.add_argument("--requests", type=positive_int, default=4000)
    parser.add_argument("--time-cap", type=float, default=20.0)
    parser.add_argument("--concurrency", type=positive_int, nargs="+", default=[1, 16])
    add_json_argument(parser)
    args = parser.parse_args(argv)
    if args.serve:
        asyncio.run(_serve(args.serve))
        return 0
    started = {kind: _start(kind) for kind in SERVERS}
    figures: dict[str, dict[int, list[float]]] = {
        kind: {c: [] for c in args.concurrency} for kind in SERVERS
    }
    try:
        for _, port in started.values():  # warm-up, unmeasured
            asyncio.run(_load(port, 500, 4, args.time_cap))
        for round_ in range(args.rounds):
            order = SERVERS if round_ % 2 == 0 else tuple(reversed(SERVERS))
            for kind in order:
                process, port = started[kind]
                for concurrency in args.concurrency:
                    before = _cpu_seconds(process.pid)
                    answered = asyncio.run(_load(port, args.requests, concurrency, args.time_cap))
                    used = _cpu_seconds(process.pid) - before
                    figures[kind][concurrency].append(used / max(answered, 1) * 1e6)
    finally:
        for process, _ in started.values():
            process.kill()
            process.wait()
    results = {
        kind: {str(c): statistics.median(values) for c, values in by_concurrency.items()}
        for kind, by_concurrency in figures.items()
    }
    print("server CPU µs per request (median of the rounds):")
    for kind, by_concurrency in results.items():
        cells = ", ".join(f"{value:.0f} at {c}" for c, value in by_concurrency.items())
        print(f"  {kind:<10} {cells}")
    if args.json is not None:
        import json

        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
