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
    python -m bench.key_status --workers 2             # `gateway up --workers 2`

With --database-url the URL names a PostgreSQL server and a database to connect to for
administration (`postgresql` alone means postgresql://postgres@127.0.0.1:5432/test); a fresh
database is created there for the run and dropped at the end. With --workers N the gateway
runs N server processes behind one Envoy; the direct gRPC calls then go round-robin to their
ports. The peak RSS (VmHWM) of the gateway's processes is read before it is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import signal
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import grpc
import httpx

from bench.common import (
    LOOPBACK,
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
from server.contract import keys_pb2, keys_pb2_grpc
from tests.support.processes import GatewayProcess

REST_PATH = "REST GET /api/v1/key (Envoy)"
GRPC_PATH = "gRPC Keys/GetCurrentKey (direct)"


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


def grpc_targets(gateway: GatewayProcess, workers: int) -> list[str]:
    """The gRPC port of each server process (`gateway up --workers N` numbers them on)."""
    return [f"{LOOPBACK}:{gateway.grpc_port + index}" for index in range(workers)]


def _grpc_call(stubs: Sequence[keys_pb2_grpc.KeysStub], key: str) -> Call:
    """Calls spread round-robin over the server processes: Envoy balances REST, nothing
    balances a direct gRPC client."""
    metadata = (("authorization", f"Bearer {key}"),)
    request = keys_pb2.GetCurrentKeyRequest()
    next_stub = itertools.cycle(stubs)

    async def call() -> str | None:
        try:
            await next(next_stub).GetCurrentKey(request, metadata=metadata, timeout=REQUEST_TIMEOUT)
        except grpc.aio.AioRpcError as error:
            return f"gRPC {error.code().name}"
        return None

    return call


async def preflight(gateway: GatewayProcess, key: str, workers: int) -> None:
    """One request per path (and server process), so a broken setup fails loudly instead of
    as 100% errors."""
    async with _rest_client(gateway.base_url, key, 1) as client:
        response = await client.get("/key")
        if response.status_code != 200 or "data" not in response.json():
            raise RuntimeError(f"REST preflight failed: {response.status_code} {response.text}")
    for target in grpc_targets(gateway, workers):
        async with _grpc_channel(target) as channel:
            await asyncio.wait_for(channel.channel_ready(), REQUEST_TIMEOUT)
            reply = await keys_pb2_grpc.KeysStub(channel).GetCurrentKey(
                keys_pb2.GetCurrentKeyRequest(),
                metadata=(("authorization", f"Bearer {key}"),),
                timeout=REQUEST_TIMEOUT,
            )
            if not reply.ByteSize():
                raise RuntimeError(f"gRPC preflight ({target}) returned an empty response")


async def run_cases(
    gateway: GatewayProcess, key: str, args: argparse.Namespace
) -> list[CaseResult]:
    await preflight(gateway, key, args.workers)
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
        async with contextlib.AsyncExitStack() as channels:
            stubs = []
            for target in grpc_targets(gateway, args.workers):
                channel = await channels.enter_async_context(_grpc_channel(target))
                await asyncio.wait_for(channel.channel_ready(), REQUEST_TIMEOUT)
                stubs.append(keys_pb2_grpc.KeysStub(channel))
            results.append(
                await measure(
                    GRPC_PATH,
                    _grpc_call(stubs, key),
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
    return (
        gateway_cli(data_dir, database_url, "keys", "create", "--name", "bench")
        .strip()
        .splitlines()[-1]
        .strip()
    )


# --- report ---------------------------------------------------------------------------------


def markdown_table(results: Sequence[CaseResult]) -> str:
    rows = [
        "| path | concurrency | requests | req/s | p50 ms | p99 ms | errors |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        requests = f"{r.requests}" + (" (time cap)" if r.hit_time_cap else "")
        rows.append(
            f"| {r.path} | {r.concurrency} | {requests} | {r.requests_per_second:.1f} "
            f"| {fmt(r.p50_ms)} | {fmt(r.p99_ms)} | {r.errors} |"
        )
    return "\n".join(rows)


def report(
    results: Sequence[CaseResult], machine: dict[str, Any], workers: int, rss: PeakRss | None
) -> str:
    lines = [markdown_table(results), ""]
    lines.append(
        f"Machine: nproc={machine['nproc']}, CPU: {machine['cpu']}, "
        f"Python {machine['python']}, database: {machine['database']}"
    )
    lines.append(f"Gateway: {workers} server process(es) behind one Envoy")
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
        prog="python -m bench.key_status",
        description="Benchmark GET /api/v1/key via Envoy and gateway.v1.Keys/GetCurrentKey "
        "via gRPC against a gateway started for the run.",
    )
    add_gateway_arguments(parser)
    add_load_arguments(parser, requests=2000, warmup=200)
    parser.add_argument(
        "--concurrency",
        type=positive_int,
        nargs="+",
        default=[1, 16],
        help="concurrency levels (1 16)",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write results as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        pg = PgServer.parse(args.database_url) if args.database_url else None
    except ValueError as error:
        print(f"key_status: error: {error}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, exit_on_sigterm)

    with tempfile.TemporaryDirectory(prefix="bench-key-status-") as tmp:
        data_dir = Path(tmp) / "data"
        data_dir.mkdir()
        with run_database(pg, data_dir) as database:
            gateway = GatewayProcess(
                data_dir=data_dir,
                database_url=database.url,
                extra_args=("--workers", str(args.workers)),
            )
            with running(gateway) as run:
                key = create_key(data_dir, database.url)
                results = asyncio.run(run_cases(gateway, key, args))

    machine = machine_info(database.label)
    print(report(results, machine, args.workers, run.peak_rss))
    if args.json is not None:
        payload = {
            "benchmark": "key_status",
            "settings": {
                "requests": args.requests,
                "warmup": args.warmup,
                "time_cap_seconds": args.time_cap,
                "concurrency": args.concurrency,
                "workers": args.workers,
            },
            "machine": machine,
            "peak_rss": None if run.peak_rss is None else asdict(run.peak_rss),
            "results": [asdict(r) for r in results],
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return 1 if any(r.errors for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
