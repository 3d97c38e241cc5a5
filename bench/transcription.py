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

The fake provider is bench/harness/stt.py (the tests' fake answers too slowly on loopback for
a 2 ms budget). The load generator is the lean keep-alive HTTP/1.1 client of
bench/harness/load.py sending the pre-encoded request: httpx costs ~0.8 ms of client CPU per
request and reaches only ~600 req/s at concurrency 16 against a fake that answers in 0.1 ms
(`--client httpx` measures with httpx instead). Each path is first checked once with httpx,
including that the gateway billed the request.

Run from the repository root:

    python -m bench.transcription                         # SQLite in the temp data dir
    python -m bench.transcription --database-url postgresql://postgres@127.0.0.1:5432/test
    python -m bench.transcription --database-url postgresql --requests 300 --json out.json
    python -m bench.transcription --workers 2             # `gateway up --workers 2`
    python -m bench.transcription --provider-transport aiohttp  # another provider transport

With --database-url the URL names a PostgreSQL server and a database to connect to for
administration (`postgresql` alone means postgresql://postgres@127.0.0.1:5432/test); a fresh
database is created there for the run and dropped at the end. With --workers N the gateway
runs N server processes behind one Envoy. The peak RSS (VmHWM) of the gateway's processes is
read before it is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from bench.harness import stt
from bench.harness.cli import (
    add_concurrency_argument,
    add_gateway_arguments,
    add_json_argument,
    add_load_arguments,
)
from bench.harness.load import (
    Call,
    CaseResult,
    LeanHttpClient,
    bearer,
    lean_call,
    loopback_client,
    measure,
)
from bench.harness.processes import (
    PeakRss,
    begin,
    create_funded_key,
    run_database,
    running_gateway,
    scratch,
)
from bench.harness.report import (
    TargetCheck,
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
from bench.harness.stt import (
    AUDIO_NAME,
    BENCH_MODEL,
    ROUTE,
    TRANSCRIPT,
    UPSTREAM_MODEL,
    FakeProviderProcess,
    Upload,
    multipart_upload,
    running_fake_provider,
    write_catalog,
)
from testkit.audio import fixture
from testkit.catalog import FAKE_KEY_ENV

DIRECT_PATH = "direct to fake provider"
GATEWAY_PATH = "REST POST /api/v1/audio/transcriptions (Envoy)"

# The targets: reported, never a failure.
TARGET_ADDED_P50_MS = 2.0
TARGET_ADDED_P50_CONCURRENCY = 1
TARGET_RPS = 1000.0
TARGET_RPS_CONCURRENCY = 16


# --- the two paths --------------------------------------------------------------------------


@dataclass(frozen=True)
class Destination:
    """Where one path is sent: base URL, bearer key and the body to post."""

    path: str
    base_url: str
    key: str
    upload: Upload

    def httpx_client(self, concurrency: int) -> httpx.AsyncClient:
        return loopback_client(
            self.base_url, bearer(self.key, self.upload.content_type), concurrency
        )

    def lean_client(self) -> LeanHttpClient:
        return LeanHttpClient(
            self.base_url + ROUTE, [self.key], self.upload.content_type, self.upload.content
        )


def _httpx_call(client: httpx.AsyncClient, upload: Upload) -> Call:
    async def call() -> str | None:
        response = await client.post(ROUTE, content=upload.content)
        return None if response.status_code == 200 else f"HTTP {response.status_code}"

    return call


async def preflight(target: Destination) -> None:
    """One request per path through httpx, so a broken setup fails loudly instead of as 100%
    errors, and the answer is checked by an independent client."""
    async with target.httpx_client(1) as client:
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
    async with target.lean_client() as lean:
        status = await lean.post()
        if status != 200:
            raise RuntimeError(f"{target.path} preflight (lean client) failed: HTTP {status}")


async def _measure_one(
    target: Destination, concurrency: int, args: argparse.Namespace
) -> CaseResult:
    def run(call: Call) -> Awaitable[CaseResult]:
        return measure(target.path, call, concurrency, args.requests, args.warmup, args.time_cap)

    if args.client == "httpx":
        async with target.httpx_client(concurrency) as client:
            return await run(_httpx_call(client, target.upload))
    async with target.lean_client() as lean:
        return await run(lean_call(lean))


async def run_cases(
    fake: FakeProviderProcess, gateway_url: str, key: str, args: argparse.Namespace
) -> list[CaseResult]:
    audio = fixture(AUDIO_NAME)
    direct = Destination(
        DIRECT_PATH, fake.base_url, fake.api_key, multipart_upload(UPSTREAM_MODEL, audio)
    )
    through = Destination(GATEWAY_PATH, gateway_url, key, multipart_upload(BENCH_MODEL, audio))
    for target in (direct, through):
        await preflight(target)
    results: list[CaseResult] = []
    for concurrency in args.concurrency:
        for target in (direct, through):
            results.append(await _measure_one(target, concurrency, args))
            case_done(results[-1])
    return results


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


def report(
    results: Sequence[CaseResult],
    machine: dict[str, Any],
    client: str,
    workers: int,
    rss: PeakRss | None,
) -> str:
    table = markdown_table(
        ["path", "concurrency", "requests", "req/s", "p50 ms", "p99 ms", "added p50 ms", "errors"],
        [
            [
                r.path,
                r.concurrency,
                requests_cell(r.requests, r.hit_time_cap),
                f"{r.requests_per_second:.1f}",
                fmt(r.p50_ms),
                fmt(r.p99_ms),
                fmt(added_p50(results, r.concurrency) if r.path == GATEWAY_PATH else None),
                r.errors,
            ]
            for r in results
        ],
    )
    latency, throughput = target_checks(results)
    lines = [
        table,
        "",
        "Targets of the issue (reported, not enforced):",
        latency.line("ms"),
        throughput.line("req/s"),
        "",
        machine_line(machine, f"load generator: {client}"),
        *gateway_lines(workers, rss),
    ]
    return "\n".join(lines + error_lines(results))


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
    add_concurrency_argument(parser)
    parser.add_argument(
        "--client",
        choices=("lean", "httpx"),
        default="lean",
        help="load generator: a minimal keep-alive HTTP/1.1 client (lean, default) or httpx "
        "(as bench.key_status; its own CPU cost then limits the higher rates)",
    )
    parser.add_argument(
        "--provider-transport",
        choices=("gateway", "httpx", "aiohttp"),
        default="gateway",
        help="the HTTP transport under the gateway's provider client "
        "(GATEWAY_PROVIDER_TRANSPORT): its own (default), httpx's, or aiohttp's "
        "(httpx-aiohttp, from the `bench` extra)",
    )
    add_json_argument(parser)
    # Internal, kept for older callers: the fake provider's own process (bench.harness.stt).
    parser.add_argument("--serve-fake-provider", action="store_true", help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.serve_fake_provider:
        return stt.main()
    pg = begin("transcription", args.database_url)
    with (
        scratch("bench-transcription-") as tmp,
        run_database(pg, tmp / "data") as database,
        running_fake_provider() as fake,
        running_gateway(
            tmp / "data",
            database,
            args.workers,
            {
                "GATEWAY_CATALOG": str(write_catalog(tmp / "catalog.toml", fake.base_url)),
                FAKE_KEY_ENV: fake.api_key,
                "GATEWAY_PROVIDER_TRANSPORT": args.provider_transport,
            },
        ) as run,
    ):
        key = create_funded_key(tmp / "data", database.url)
        results = asyncio.run(run_cases(fake, run.gateway.base_url, key, args))

    machine = machine_info(database.label)
    print(report(results, machine, args.client, args.workers, run.peak_rss))
    latency, throughput = target_checks(results)
    write_json(
        args.json,
        "transcription",
        load_settings(
            args,
            client=args.client,
            workers=args.workers,
            provider_transport=args.provider_transport,
            model=BENCH_MODEL,
            audio=f"testkit/fixtures/{AUDIO_NAME}.wav",
        ),
        machine,
        rss_json(run.peak_rss),
        results=[asdict(r) for r in results],
        added_p50_ms={str(c): added_p50(results, c) for c in args.concurrency},
        targets=[asdict(latency), asdict(throughput)],
    )
    return 1 if any(r.errors for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
