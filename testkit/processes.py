"""Starting and stopping the real gateway for tests: `gateway up` in a subprocess."""

from __future__ import annotations

import collections
import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

READY_LINE = "Gateway ready"
# `gateway up` processes this test process started: the suite's biggest cost, so the session
# reports it (tests/conftest.py, pytest_terminal_summary).
STARTED: list[str] = []


def free_port() -> int:
    """A free loopback port of this test process's own block (see free_port_range)."""
    return free_port_range(1)


_REFUSING: list[socket.socket] = []


def refusing_port() -> int:
    """A loopback port where connections are refused, for as long as the tests run: it is
    bound by this process and never listened on, so nothing else can take it (a port from
    free_port() is only free until someone binds it)."""
    if not _REFUSING:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        _REFUSING.append(sock)
    return int(_REFUSING[0].getsockname()[1])


def _ephemeral_floor() -> int:
    try:
        low = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0]
        return int(low)
    except (OSError, ValueError, IndexError):
        return 32768


PORTS_FROM = 10_000
PORT_BLOCKS = 17  # one for a plain `pytest`, one per xdist worker gw0..gw15
# Ports handed out lately by this process: a port is free until its server binds it, and
# that can be seconds later (a gateway starting), so it is not handed out again meanwhile.
_HANDED: collections.deque[int] = collections.deque(maxlen=300)


def worker_ports() -> range:
    """This test process's own block of ports, below the ephemeral range (there, no client
    connection can take a port before its server binds it). Under pytest-xdist each worker
    (PYTEST_XDIST_WORKER=gwN) has a block of its own, so two workers never pick the same
    port however close together they start gateways."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) + 1 if worker[2:].isdigit() else 0
    size = max(_ephemeral_floor(), PORTS_FROM + 2 * PORT_BLOCKS * 100) - PORTS_FROM
    size //= PORT_BLOCKS
    first = PORTS_FROM + (index % PORT_BLOCKS) * size
    return range(first, first + size)


def free_port_range(count: int) -> int:
    """The first of `count` consecutive free ports of this process's block (worker_ports):
    `gateway up --workers N` listens on grpc_port .. grpc_port+N-1, and as many metrics
    ports. Each is probed by binding it, and none was handed out lately by this process."""
    block = worker_ports()
    rng = random.Random()
    for _ in range(10_000):
        base = rng.randrange(block.start, block.stop - count)
        ports = range(base, base + count)
        if _HANDED and set(ports).intersection(_HANDED):
            continue
        with contextlib.ExitStack() as held:
            try:
                for port in ports:
                    sock = held.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED.extend(ports)
        return base
    raise RuntimeError(f"no {count} consecutive free ports in {block}")


def _workers_of(arguments: tuple[str, ...]) -> int:
    if "--workers" in arguments:
        return int(arguments[arguments.index("--workers") + 1])
    return 1


# "Gateway ready: REST http://127.0.0.1:PORT/api/v1  gRPC 127.0.0.1:PORT[, 127.0.0.1:PORT]"
_READY_PORTS = re.compile(r"REST https?://[^ ]*:(?P<http>\d+)/api/v1\s+gRPC (?P<grpc>[^\n]+)")


def ready_ports(line: str) -> tuple[int, list[int]]:
    """The REST port and the gRPC port of each server process, from the ready line."""
    found = _READY_PORTS.search(line)
    if found is None:
        raise RuntimeError(f"no ports in the ready line: {line!r}")
    grpc_ports = [int(target.rpartition(":")[2]) for target in found["grpc"].split(",")]
    return int(found["http"]), grpc_ports


@dataclass
class GatewayProcess:
    """One `gateway up` (gRPC server + Envoy) with its own ports and data dir. The REST and
    gRPC ports default to 0: the gateway binds free ones and prints them in its ready line,
    read back into http_port and grpc_ports."""

    data_dir: Path
    database_url: str
    http_port: int = 0  # 0: a free one, bound by Envoy (read back from the ready line)
    grpc_port: int = 0  # 0: a free one for each server process (idem)
    metrics_port: int | None = 0  # 0: free ports drawn here; None: no --metrics-port (off)
    extra_env: dict[str, str] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    # What runs `up` (Python arguments): another entry point taking the same options and
    # printing READY_LINE, e.g. the benchmark's gateway without limits.
    command: tuple[str, ...] = ("-m", "server", "up")
    process: subprocess.Popen[str] | None = None
    output: list[str] = field(default_factory=list)
    grpc_ports: list[int] = field(default_factory=list)  # each server process's, once ready

    def __post_init__(self) -> None:
        self._asked = (self.http_port, self.grpc_port)
        # /metrics has no "pick a free port" (0 is off): those ports are still probed here.
        self._metrics_drawn = self.metrics_port == 0
        if self._metrics_drawn:
            self.metrics_port = free_port_range(_workers_of(self.extra_args))

    def _metrics_port_taken(self) -> bool:
        """The start failed on a metrics port drawn here, which another program bound
        between the probe and the gateway's bind: worth another draw."""
        refused = re.search(r"cannot listen on [^ ]*:(\d+) \(--metrics-port", self.log())
        return refused is not None and self._metrics_drawn

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/api/v1"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def start(self, ready_within: float = 60.0, draws: int = 3) -> GatewayProcess:
        """`gateway up`, returning once it is ready with the ports it bound; a metrics port
        drawn here that was taken meanwhile is drawn again (`draws` times in all)."""
        for draw in range(draws):
            try:
                return self._start(ready_within)
            except RuntimeError:
                if draw == draws - 1 or not self._metrics_port_taken():
                    raise
                self.output.clear()
                self.metrics_port = free_port_range(_workers_of(self.extra_args))
        raise AssertionError("unreachable")

    def _start(self, ready_within: float) -> GatewayProcess:
        STARTED.append(os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0])
        env = {**os.environ, "GATEWAY_DATABASE_URL": self.database_url, **self.extra_env}
        self.process = subprocess.Popen(
            [
                sys.executable,
                *self.command,
                "--data-dir",
                str(self.data_dir),
                "--http-port",
                str(self._asked[0]),
                "--grpc-port",
                str(self._asked[1]),
                *(() if self.metrics_port is None else ("--metrics-port", str(self.metrics_port))),
                *self.extra_args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        ready = threading.Event()

        def pump() -> None:
            assert self.process is not None and self.process.stdout is not None
            for line in self.process.stdout:
                self.output.append(line)
                if READY_LINE in line:
                    ready.set()

        pumping = threading.Thread(target=pump, daemon=True)
        pumping.start()
        deadline = time.monotonic() + ready_within
        while not ready.wait(0.1):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pumping.join(5)  # its last lines say why
                raise RuntimeError("gateway did not start:\n" + "".join(self.output))
        line = next(line for line in self.output if READY_LINE in line)
        self.http_port, self.grpc_ports = ready_ports(line)
        self.grpc_port = self.grpc_ports[0]
        return self

    def stop(self, grace: float = 20.0) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(grace)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def log(self) -> str:
        return "".join(self.output)

    def master_key_env(self) -> dict[str, str]:
        """The vault master key this gateway uses, as GATEWAY_VAULT_MASTER_KEY: what another
        gateway on its database (with a data dir of its own) must be given, or it refuses
        to start."""
        given = self.extra_env.get("GATEWAY_VAULT_MASTER_KEY")
        if given is None:
            given = (self.data_dir / "vault-master.key").read_text().strip()
        return {"GATEWAY_VAULT_MASTER_KEY": given}
