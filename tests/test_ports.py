"""Several gateways on one host: default ports that cannot collide, a refusal to share a
served HTTP port, and bind failures that name the address and the flag that sets it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from facade.launcher import EnvoyProcess
from facade.stack import envoy_options, start_envoy
from server.config import Settings
from server.ports import ListenError
from testkit.processes import GatewayProcess, free_port_range, refusing_port

ENVIRONMENT = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}


@contextmanager
def listening(port: int = 0, *, reuse_port: bool = False) -> Iterator[int]:
    """A socket listening on 127.0.0.1:port (another program holding the port)."""
    with socket.socket() as holder:
        if reuse_port:
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind(("127.0.0.1", port))
        holder.listen()
        yield int(holder.getsockname()[1])


def up(data_dir: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """`gateway up` expected to refuse to start: its exit status is 1, its stderr returned."""
    ran = subprocess.run(
        [sys.executable, "-m", "server.cli", "up", "--data-dir", str(data_dir), *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env={**ENVIRONMENT, **(env or {})},
    )
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "Gateway ready" not in ran.stdout
    return ran.stderr


def sqlite(data_dir: Path) -> str:
    return f"sqlite+aiosqlite:///{data_dir / 'gateway.db'}"


def test_two_gateways_with_default_flags_but_their_own_ports_run_side_by_side(
    tmp_path: Path,
) -> None:
    """Only --http-port, --grpc-port and --data-dir differ: the metrics endpoint (off unless
    asked for) and Envoy's admin port (ephemeral) do not collide."""
    gateways = [
        GatewayProcess(
            data_dir=tmp_path / name, database_url=sqlite(tmp_path / name), metrics_port=None
        )
        for name in ("a", "b")
    ]
    try:
        for gateway in gateways:
            gateway.extra_env = {"GATEWAY_METRICS_PORT": ""}
            gateway.start()
        for gateway in gateways:
            response = httpx.get(
                f"{gateway.base_url}/key", headers={"Authorization": "Bearer sk-gw-v1-nope"}
            )
            assert response.status_code == 401
    finally:
        for gateway in gateways:
            gateway.stop()
    for gateway in gateways:
        assert gateway.process is not None and gateway.process.returncode == 0, gateway.log()


def test_a_second_gateway_on_a_served_http_port_refuses_to_start(tmp_path: Path) -> None:
    first = GatewayProcess(data_dir=tmp_path / "a", database_url=sqlite(tmp_path / "a"))
    first.start()
    try:
        created = subprocess.run(
            [
                sys.executable,
                *("-m", "server.cli", "keys", "create", "--name", "k"),
                "--data-dir",
                str(first.data_dir),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=ENVIRONMENT,
        )
        key = created.stdout.strip().splitlines()[-1]
        port = first.http_port
        stderr = up(tmp_path / "b", "--http-port", str(port), "--grpc-port", "0")
        assert stderr.strip() == (
            f"gateway: error: cannot listen on 127.0.0.1:{port} (--http-port): "
            "address already in use"
        )
        # The first gateway alone answers on its port: one key, one answer.
        for _ in range(20):
            response = httpx.get(
                f"{first.base_url}/key", headers={"Authorization": f"Bearer {key}"}
            )
            assert response.status_code == 200
    finally:
        assert first.stop() == 0


def test_a_taken_grpc_port_names_the_flag(tmp_path: Path) -> None:
    with listening() as port:
        stderr = up(tmp_path, "--grpc-port", str(port), "--http-port", "0")
    assert stderr.strip() == (
        f"gateway: error: cannot listen on 127.0.0.1:{port} (--grpc-port): address already in use"
    )


@pytest.mark.parametrize("how", ["flag", "environment", "second worker"])
@pytest.mark.parametrize(
    ("flag", "variable"),
    [
        ("--metrics-port", "GATEWAY_METRICS_PORT"),
        # the server's REST listener (server/rest/): a free port unless given, as gRPC's 0
        ("--rest-port", "GATEWAY_REST_PORT"),
    ],
)
def test_a_taken_worker_port_names_the_flag_and_variable(
    tmp_path: Path, how: str, flag: str, variable: str
) -> None:
    """A port of each server process, given by flag or variable: the second worker's is the
    next one."""
    base = free_port_range(2)
    taken = base + 1 if how == "second worker" else base
    args = ["--http-port", "0", "--grpc-port", "0"]
    env: dict[str, str] = {}
    if how == "environment":
        env[variable] = str(base)
    else:
        args += [flag, str(base)]
    if how == "second worker":
        args += ["--workers", "2"]
    with listening(taken):
        stderr = up(tmp_path, *args, env=env)
    assert stderr.strip() == (
        f"gateway: error: cannot listen on 127.0.0.1:{taken} "
        f"({flag} / {variable}): address already in use"
    )


def test_a_taken_envoy_admin_port_names_its_variable(tmp_path: Path) -> None:
    with listening() as port:
        stderr = up(
            tmp_path,
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            env={"GATEWAY_ENVOY_ADMIN_PORT": str(port)},
        )
    assert stderr.strip() == (
        f"gateway: error: cannot listen on 127.0.0.1:{port} (GATEWAY_ENVOY_ADMIN_PORT): "
        "address already in use"
    )


@pytest.mark.parametrize("which", ["listener", "admin"])
async def test_envoy_itself_refuses_a_port_in_use(tmp_path: Path, which: str) -> None:
    """Past the check before start (a port taken in between): Envoy does not share its
    listener (no SO_REUSEPORT, which Envoy sets by default: the holder here allows it), and
    the failure it reports is turned into the same message."""
    with listening(reuse_port=True) as port:
        settings = Settings(
            data_dir=tmp_path,
            database_url=sqlite(tmp_path),
            grpc_port=refusing_port(),  # Envoy only needs an upstream address
            http_port=port if which == "listener" else 0,
            envoy_admin_port=port if which == "admin" else 0,
        )
        envoy = EnvoyProcess(envoy_options(settings), tmp_path / "envoy")
        try:
            with pytest.raises(ListenError) as raised:
                await start_envoy(envoy)
        finally:
            await envoy.stop()
    setting = "--http-port" if which == "listener" else "GATEWAY_ENVOY_ADMIN_PORT"
    assert str(raised.value) == (
        f"cannot listen on 127.0.0.1:{port} ({setting}): address already in use"
    )


def test_port_0_binds_free_ports_and_the_ready_line_names_them(tmp_path: Path) -> None:
    """`--http-port 0 --grpc-port 0 --workers 2`: Envoy and each server process bind a free
    port of their own; the ready line and the console line print the ports bound, and they
    serve (REST through Envoy, gRPC health on each server process)."""
    gateway = GatewayProcess(
        data_dir=tmp_path,
        database_url=sqlite(tmp_path),
        metrics_port=None,
        extra_args=("--workers", "2"),
    )
    assert (gateway.http_port, gateway.grpc_port) == (0, 0)
    try:
        gateway.start()
        ports = [gateway.http_port, *gateway.grpc_ports]
        assert 0 not in ports and len(set(ports)) == 3, gateway.log()
        console = f"Console: http://127.0.0.1:{gateway.http_port}/console/"
        deadline = time.monotonic() + 10  # the line after the ready line: still being read
        while console not in gateway.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert console in gateway.log()
        response = httpx.get(
            f"{gateway.base_url}/key", headers={"Authorization": "Bearer sk-gw-v1-nope"}
        )
        assert response.status_code == 401
        for port in gateway.grpc_ports:
            target = f"127.0.0.1:{port}"
            health = subprocess.run(
                [sys.executable, "-m", "server.cli", "health", "--grpc-target", target],
                capture_output=True,
                timeout=60,
                env=ENVIRONMENT,
            )
            assert health.returncode == 0, health.stderr
    finally:
        gateway.stop()
    assert gateway.process is not None and gateway.process.returncode == 0, gateway.log()
