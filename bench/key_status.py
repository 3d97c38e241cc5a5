"""Benchmark GET /api/v1/key: REST through Envoy and the same rpc directly over gRPC.

Starts its own gateway (`gateway up`, gRPC server + Envoy) on a fresh temporary data dir,
issues an API key with `gateway keys create`, then measures, for each path and concurrency:
a short warm-up, then a bounded run (a fixed number of requests, cut off by a hard time cap).
Every response must be HTTP 200 / gRPC OK; anything else is counted as an error. Latency
percentiles are over the successful requests. Only 127.0.0.1 is contacted.

Run from the repository root:

    python -m bench.key_status                         # SQLite in the temp data dir
    python -m bench.key_status --database-url postgresql://postgres@127.0.0.1:5432/test
    python -m bench.key_status --database-url postgresql --requests 500 --json out.json

With --database-url the URL names a PostgreSQL server and a database to connect to for
administration (`postgresql` alone means postgresql://postgres@127.0.0.1:5432/test); a fresh
database is created there for the run and dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import grpc
import httpx

from server.config import sqlite_url
from server.contract import keys_pb2, keys_pb2_grpc
from tests.support.processes import GatewayProcess

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
LOOPBACK = "127.0.0.1"
REST_PATH = "REST GET /api/v1/key (Envoy)"
GRPC_PATH = "gRPC Keys/GetCurrentKey (direct)"
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
        p50_ms=_round(percentile(latencies, 50)),
        p99_ms=_round(percentile(latencies, 99)),
        hit_time_cap=hit_cap,
        error_kinds=dict(tally.errors),
    )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


# --- the two paths --------------------------------------------------------------------------


def _rest_client(base_url: str, key: str, concurrency: int) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=base_url,
        headers={"Authorization": f"Bearer {key}"},
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


def _rest_call(client: httpx.AsyncClient) -> Call:
    async def call() -> str | None:
        response = await client.get("/key")
        return None if response.status_code == 200 else f"HTTP {response.status_code}"

    return call


def _grpc_channel(target: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(target, options=[("grpc.enable_http_proxy", 0)])


def _grpc_call(stub: keys_pb2_grpc.KeysStub, key: str) -> Call:
    metadata = (("authorization", f"Bearer {key}"),)
    request = keys_pb2.GetCurrentKeyRequest()

    async def call() -> str | None:
        try:
            await stub.GetCurrentKey(request, metadata=metadata, timeout=REQUEST_TIMEOUT)
        except grpc.aio.AioRpcError as error:
            return f"gRPC {error.code().name}"
        return None

    return call


async def preflight(gateway: GatewayProcess, key: str) -> None:
    """One request per path, so a broken setup fails loudly instead of as 100% errors."""
    async with _rest_client(gateway.base_url, key, 1) as client:
        response = await client.get("/key")
        if response.status_code != 200 or "data" not in response.json():
            raise RuntimeError(f"REST preflight failed: {response.status_code} {response.text}")
    async with _grpc_channel(gateway.grpc_target) as channel:
        await asyncio.wait_for(channel.channel_ready(), REQUEST_TIMEOUT)
        reply = await keys_pb2_grpc.KeysStub(channel).GetCurrentKey(
            keys_pb2.GetCurrentKeyRequest(),
            metadata=(("authorization", f"Bearer {key}"),),
            timeout=REQUEST_TIMEOUT,
        )
        if not reply.ByteSize():
            raise RuntimeError("gRPC preflight returned an empty response")


async def run_cases(
    gateway: GatewayProcess, key: str, args: argparse.Namespace
) -> list[CaseResult]:
    await preflight(gateway, key)
    results: list[CaseResult] = []
    for concurrency in args.concurrency:
        async with _rest_client(gateway.base_url, key, concurrency) as client:
            results.append(
                await measure(
                    REST_PATH,
                    _rest_call(client),
                    concurrency,
                    args.requests,
                    args.warmup,
                    args.time_cap,
                )
            )
        _progress(results[-1])
    for concurrency in args.concurrency:
        async with _grpc_channel(gateway.grpc_target) as channel:
            await asyncio.wait_for(channel.channel_ready(), REQUEST_TIMEOUT)
            stub = keys_pb2_grpc.KeysStub(channel)
            results.append(
                await measure(
                    GRPC_PATH,
                    _grpc_call(stub, key),
                    concurrency,
                    args.requests,
                    args.warmup,
                    args.time_cap,
                )
            )
        _progress(results[-1])
    return results


def _progress(result: CaseResult) -> None:
    print(
        f"  done: {result.path}, concurrency {result.concurrency}: "
        f"{result.requests_per_second} req/s",
        file=sys.stderr,
        flush=True,
    )


# --- gateway, key and database --------------------------------------------------------------


def create_key(data_dir: Path, database_url: str) -> str:
    env = {**os.environ, "GATEWAY_DATABASE_URL": database_url}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "server.cli",
            "keys",
            "create",
            "--name",
            "bench",
            "--data-dir",
            str(data_dir),
        ],
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(
            f"`gateway keys create` failed ({done.returncode}):\n{done.stdout}{done.stderr}"
        )
    return lines[-1].strip()


@dataclass(frozen=True)
class PgServer:
    """A PostgreSQL server on 127.0.0.1, reached through an administrative database."""

    admin_url: str  # plain postgresql:// URL, for asyncpg

    @classmethod
    def parse(cls, text: str) -> PgServer:
        if text in ("postgresql", "postgres", "pg"):
            text = DEFAULT_PG_ADMIN_URL
        parts = urlsplit(text)
        scheme = parts.scheme.split("+", 1)[0]
        if scheme not in ("postgresql", "postgres"):
            raise ValueError(f"--database-url must be a postgresql:// URL, not {text!r}")
        if parts.hostname != LOOPBACK:
            raise ValueError(f"--database-url must point at {LOOPBACK}, not {parts.hostname!r}")
        return cls(urlunsplit(parts._replace(scheme="postgresql")))

    def database_url(self, name: str) -> str:
        """SQLAlchemy URL of database `name` on this server, for the gateway."""
        parts = urlsplit(self.admin_url)
        return urlunsplit(parts._replace(scheme="postgresql+asyncpg", path=f"/{name}"))

    async def _execute(self, statement: str) -> str:
        connection = await asyncpg.connect(self.admin_url, timeout=10)
        try:
            await connection.execute(statement)
            return str(await connection.fetchval("SHOW server_version"))
        finally:
            await connection.close()

    async def create(self, name: str) -> str:
        """Create database `name`; return the server version."""
        return await self._execute(f'CREATE DATABASE "{name}"')

    async def drop(self, name: str) -> None:
        await self._execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- report ---------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _nproc() -> int:
    if shutil.which("nproc"):
        done = subprocess.run(["nproc"], capture_output=True, text=True, check=False)
        if done.returncode == 0 and done.stdout.strip().isdigit():
            return int(done.stdout.strip())
    return len(os.sched_getaffinity(0))


def machine_info(database: str) -> dict[str, Any]:
    return {
        "nproc": _nproc(),
        "cpu": _cpu_model(),
        "python": platform.python_version(),
        "database": database,
    }


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def markdown_table(results: Sequence[CaseResult]) -> str:
    rows = [
        "| path | concurrency | requests | req/s | p50 ms | p99 ms | errors |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        requests = f"{r.requests}" + (" (time cap)" if r.hit_time_cap else "")
        rows.append(
            f"| {r.path} | {r.concurrency} | {requests} | {r.requests_per_second:.1f} "
            f"| {_fmt(r.p50_ms)} | {_fmt(r.p99_ms)} | {r.errors} |"
        )
    return "\n".join(rows)


def report(results: Sequence[CaseResult], machine: dict[str, Any]) -> str:
    lines = [markdown_table(results), ""]
    lines.append(
        f"Machine: nproc={machine['nproc']}, CPU: {machine['cpu']}, "
        f"Python {machine['python']}, database: {machine['database']}"
    )
    for r in results:
        if r.error_kinds:
            kinds = ", ".join(f"{kind} x{count}" for kind, count in sorted(r.error_kinds.items()))
            lines.append(f"Errors in {r.path}, concurrency {r.concurrency}: {kinds}")
    return "\n".join(lines)


# --- main -----------------------------------------------------------------------------------


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.key_status",
        description="Benchmark GET /api/v1/key via Envoy and gateway.v1.Keys/GetCurrentKey "
        "via gRPC against a gateway started for the run.",
    )
    parser.add_argument(
        "--database-url",
        help="run on PostgreSQL: URL of the server's admin database on 127.0.0.1 "
        f"('postgresql' = {DEFAULT_PG_ADMIN_URL}); a fresh database is created and dropped. "
        "Default: SQLite in a temporary data dir",
    )
    parser.add_argument(
        "--requests", type=_positive, default=2000, help="measured requests per case (2000)"
    )
    parser.add_argument(
        "--warmup", type=int, default=200, help="warm-up requests per case, not measured (200)"
    )
    parser.add_argument(
        "--time-cap", type=float, default=60.0, help="hard time cap per case in seconds (60)"
    )
    parser.add_argument(
        "--concurrency",
        type=_positive,
        nargs="+",
        default=[1, 16],
        help="concurrency levels (1 16)",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write results as JSON")
    return parser


def _terminate(signum: int, frame: FrameType | None) -> NoReturn:
    # Turn SIGTERM into an exception so the `finally` blocks stop the gateway.
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        pg = PgServer.parse(args.database_url) if args.database_url else None
    except ValueError as error:
        print(f"key_status: error: {error}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _terminate)

    with tempfile.TemporaryDirectory(prefix="bench-key-status-") as tmp:
        data_dir = Path(tmp) / "data"
        data_dir.mkdir()
        pg_name = f"bench_{secrets.token_hex(6)}"
        if pg is None:
            database_url = sqlite_url(data_dir)
            database = "SQLite (aiosqlite, file in a temp dir)"
        else:
            version = asyncio.run(pg.create(pg_name))
            database_url = pg.database_url(pg_name)
            database = f"PostgreSQL {version} (asyncpg, 127.0.0.1)"
        try:
            gateway = GatewayProcess(data_dir=data_dir, database_url=database_url)
            try:
                print("Starting the gateway...", file=sys.stderr, flush=True)
                gateway.start()
                key = create_key(data_dir, database_url)
                results = asyncio.run(run_cases(gateway, key, args))
            except Exception:
                tail = "".join(gateway.output[-40:])
                print(f"Gateway output (last lines):\n{tail}", file=sys.stderr)
                raise
            finally:
                gateway.stop()
        finally:
            if pg is not None:
                asyncio.run(pg.drop(pg_name))

    machine = machine_info(database)
    print(report(results, machine))
    if args.json is not None:
        payload = {
            "benchmark": "key_status",
            "settings": {
                "requests": args.requests,
                "warmup": args.warmup,
                "time_cap_seconds": args.time_cap,
                "concurrency": args.concurrency,
            },
            "machine": machine,
            "results": [asdict(r) for r in results],
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return 1 if any(r.errors for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
