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
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import grpc
import httpx

from bench.harness.cli import (
    add_concurrency_argument,
    add_gateway_arguments,
    add_json_argument,
    add_load_arguments,
)
from bench.harness.load import (
    LOOPBACK,
    REQUEST_TIMEOUT,
    Call,
    CaseResult,
    bearer,
    loopback_client,
    measure,
)
from bench.harness.processes import (
    PeakRss,
    begin,
    create_key,
    run_database,
    running_gateway,
    scratch,
)
from bench.harness.report import (
    case_done,
    error_lines,
    fmt,
    gateway_lines,
    load_settings,
    machine_info,
    machine_line,
    markdown_table,
    requests_cell,
    rss_json,
    write_json,
)
from server.contract import keys_pb2, keys_pb2_grpc
from testkit.processes import GatewayProcess

REST_PATH = "REST GET /api/v1/key (Envoy)"
GRPC_PATH = "gRPC Keys/GetCurrentKey (direct)"


# --- the two paths --------------------------------------------------------------------------


def _rest_call(client: httpx.AsyncClient) -> Call:
    async def call() -> str | None:
        response = await client.get("/key")
        return None if response.status_code == 200 else f"HTTP {response.status_code}"

    return call


def _grpc_channel(target: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(target, options=[("grpc.enable_http_proxy", 0)])


def grpc_targets(gateway: GatewayProcess, workers: int) -> list[str]:
    """The gRPC port of each server process (read from the ready line)."""
    return [f"{LOOPBACK}:{port}" for port in gateway.grpc_ports[:workers]]


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
    async with loopback_client(gateway.base_url, bearer(key), 1) as client:
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

    async def run(path: str, call: Call, concurrency: int) -> None:
        results.append(
            await measure(path, call, concurrency, args.requests, args.warmup, args.time_cap)
        )
        case_done(results[-1], p50=False)

    for concurrency in args.concurrency:
        async with loopback_client(gateway.base_url, bearer(key), concurrency) as client:
            await run(REST_PATH, _rest_call(client), concurrency)
    for concurrency in args.concurrency:
        async with contextlib.AsyncExitStack() as channels:
            stubs = []
            for target in grpc_targets(gateway, args.workers):
                channel = await channels.enter_async_context(_grpc_channel(target))
                await asyncio.wait_for(channel.channel_ready(), REQUEST_TIMEOUT)
                stubs.append(keys_pb2_grpc.KeysStub(channel))
            await run(GRPC_PATH, _grpc_call(stubs, key), concurrency)
    return results


# --- report ---------------------------------------------------------------------------------


def report(
    results: Sequence[CaseResult], machine: dict[str, Any], workers: int, rss: PeakRss | None
) -> str:
    table = markdown_table(
        ["path", "concurrency", "requests", "req/s", "p50 ms", "p99 ms", "errors"],
        [
            [
                r.path,
                r.concurrency,
                requests_cell(r.requests, r.hit_time_cap),
                f"{r.requests_per_second:.1f}",
                fmt(r.p50_ms),
                fmt(r.p99_ms),
                r.errors,
            ]
            for r in results
        ],
    )
    lines = [table, "", machine_line(machine), *gateway_lines(workers, rss)]
    return "\n".join(lines + error_lines(results))


# --- main -----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.key_status",
        description="Benchmark GET /api/v1/key via Envoy and gateway.v1.Keys/GetCurrentKey "
        "via gRPC against a gateway started for the run.",
    )
    add_gateway_arguments(parser)
    add_load_arguments(parser, requests=2000, warmup=200)
    add_concurrency_argument(parser)
    add_json_argument(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    pg = begin("key_status", args.database_url)
    with scratch("bench-key-status-") as tmp:
        data_dir = tmp / "data"
        with (
            run_database(pg, data_dir) as database,
            running_gateway(data_dir, database, args.workers) as run,
        ):
            key = create_key(data_dir, database.url)
            results = asyncio.run(run_cases(run.gateway, key, args))

    machine = machine_info(database.label)
    print(report(results, machine, args.workers, run.peak_rss))
    write_json(
        args.json,
        "key_status",
        load_settings(args, workers=args.workers),
        machine,
        rss_json(run.peak_rss),
        results=[asdict(r) for r in results],
    )
    return 1 if any(r.errors for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
