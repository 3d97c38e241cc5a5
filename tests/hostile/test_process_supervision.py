"""`gateway up` when one of its processes dies (issue 29, item 6), end to end: a server
process of `--workers 2` or Envoy killed with SIGKILL is started again (on the port it
had; logged: which, its pid, how it died) while the rest keeps serving; one that keeps
dying stops the gateway with status 1 and a line saying which and how; SIGTERM after a
restart is still a clean stop (status 0)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import httpx

from facade.launcher import ENVOY_WORKERS
from server.db.engine import create_engine, session_factory
from testkit.admin import Admin, IssuedKey
from testkit.eventually import eventually
from testkit.processes import GatewayProcess
from tests.conftest import Databases
from tests.support.rss import children

# Short bounds: restart quickly, and give up at the second death within a minute.
SUPERVISION = {
    "GATEWAY_RESTART_LIMIT": "2",
    "GATEWAY_RESTART_WINDOW_SECONDS": "60",
    "GATEWAY_RESTART_BACKOFF_SECONDS": "0.2",
}


def _cmdline(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def worker_pid(gateway: GatewayProcess, index: int) -> int | None:
    """The running `gateway serve` child writing ports/grpc-<index>."""
    assert gateway.process is not None
    for child in children(gateway.process.pid):
        arguments = _cmdline(child)
        if b"serve" in arguments and any(a.endswith(b"grpc-%d" % index) for a in arguments):
            return child
    return None


def envoy_pid(gateway: GatewayProcess) -> int | None:
    assert gateway.process is not None
    for child in children(gateway.process.pid):
        if b"--disable-hot-restart" in _cmdline(child):
            return child
    return None


async def _key(url: str) -> IssuedKey:
    engine = create_engine(url)
    try:
        admin = Admin(session_factory(engine))
        return await admin.key(await admin.workspace("supervised"))
    finally:
        await engine.dispose()


async def serving(gateway: GatewayProcess, key: IssuedKey, in_a_row: int = 10) -> bool:
    """`in_a_row` GET /key answered 200 in a row through Envoy (both workers in rotation)."""
    async with httpx.AsyncClient(timeout=5) as client:
        for _ in range(in_a_row):
            try:
                response = await client.get(f"{gateway.base_url}/key", headers=key.headers)
            except httpx.HTTPError:
                return False
            if response.status_code != 200:
                return False
    return True


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and b"" != Path(f"/proc/{pid}/cmdline").read_bytes()


async def test_a_killed_worker_or_envoy_is_restarted_and_one_that_keeps_dying_stops_the_gateway(
    databases: Databases, tmp_path: Path
) -> None:
    url = await databases.new("sqlite")
    gateway = GatewayProcess(
        data_dir=tmp_path / "gw",
        database_url=url,
        extra_args=("--workers", "2"),
        extra_env=SUPERVISION,
    )
    await asyncio.to_thread(gateway.start)
    try:
        key = await _key(url)
        assert await serving(gateway, key)
        first, second = worker_pid(gateway, 0), worker_pid(gateway, 1)
        envoy = envoy_pid(gateway)
        assert first and second and envoy, gateway.log()

        # Worker 1 dies: restarted on its port; worker 0 and Envoy keep serving meanwhile.
        os.kill(second, signal.SIGKILL)
        await eventually(
            lambda: f"worker 1 (pid {second}) killed by SIGKILL; restarting it" in gateway.log(),
            within=10,
        )
        await eventually(lambda: worker_pid(gateway, 1) not in (None, second), within=30)
        await eventually(lambda: "worker 1 restarted" in gateway.log(), within=60)
        await eventually(lambda: serving(gateway, key), within=20, message="both workers")
        assert worker_pid(gateway, 0) == first
        assert gateway.process is not None and gateway.process.poll() is None

        # Envoy dies: started again on the same REST port; the workers untouched.
        os.kill(envoy, signal.SIGKILL)
        await eventually(
            lambda: f"Envoy (pid {envoy}) killed by SIGKILL; restarting it" in gateway.log(),
            within=10,
        )
        await eventually(lambda: serving(gateway, key), within=20, message="REST again")
        assert envoy_pid(gateway) not in (None, envoy)
        assert worker_pid(gateway, 0) == first

        # Worker 1 dies again within the window: the limit (2) is reached, the gateway stops.
        again = worker_pid(gateway, 1)
        assert again is not None
        os.kill(again, signal.SIGKILL)
        status = await asyncio.to_thread(gateway.process.wait, 60)
        assert status == 1, gateway.log()
        last = gateway.log().strip().splitlines()[-1]
        assert last.startswith("gateway: error: worker 1 (pid ")
        assert f"(pid {again}) killed by SIGKILL; it died 2 times within 60 s" in last
        assert "Gateway stopped." not in gateway.log()
        assert not _alive(first)  # the healthy worker was stopped with it, not orphaned
    finally:
        await asyncio.to_thread(gateway.stop)


async def test_envoy_killed_under_one_server_is_restarted_and_sigterm_still_stops_cleanly(
    databases: Databases, tmp_path: Path
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'gw' / 'gateway.db'}"  # the embedded default
    gateway = GatewayProcess(data_dir=tmp_path / "gw", database_url=url, extra_env=SUPERVISION)
    # Started under the loosest umask: what it writes in its data dir is private anyway
    # (issue 29 item 7; checked here, where a gateway runs, rather than with one more).
    umask = os.umask(0)
    try:
        await asyncio.to_thread(gateway.start)
    finally:
        os.umask(umask)
    try:
        key = await _key(url)
        loose = [
            f"{path} {oct(path.stat().st_mode & 0o777)}"
            for path in [tmp_path / "gw", *(tmp_path / "gw").rglob("*")]
            if path.stat().st_mode & 0o077
        ]
        assert loose == [], "readable by others"
        envoy = envoy_pid(gateway)
        assert envoy is not None
        os.kill(envoy, signal.SIGKILL)
        await eventually(
            lambda: f"Envoy (pid {envoy}) killed by SIGKILL; restarting it" in gateway.log(),
            within=10,
        )
        await eventually(lambda: serving(gateway, key), within=20, message="REST again")
    finally:
        status = await asyncio.to_thread(gateway.stop)
    assert status == 0, gateway.log()
    assert "Gateway stopped." in gateway.log()


async def test_requests_right_after_a_worker_dies_are_served_by_the_other(
    databases: Databases, tmp_path: Path
) -> None:
    """A worker killed between requests: until Envoy's health check marks it down, requests
    it would have been given fail to connect to it. Envoy tries them again on the other
    worker — only failures where the request never reached a server (connect failure,
    refused stream, reset before the request was sent), so nothing is done twice. Before:
    503 "upstream connect error" for about half of them. What is left: each Envoy worker
    thread's pool may still hand one request to its connection to the dead process before
    it has seen that connection close (the request was written: not retried), so at most
    ENVOY_WORKERS requests fail."""
    url = await databases.new("sqlite")
    gateway = GatewayProcess(
        data_dir=tmp_path / "gw",
        database_url=url,
        extra_args=("--workers", "2"),
        # The dead worker stays dead for the whole test: no restart to hide the failures.
        extra_env={**SUPERVISION, "GATEWAY_RESTART_BACKOFF_SECONDS": "60"},
    )
    await asyncio.to_thread(gateway.start)
    try:
        key = await _key(url)
        assert await serving(gateway, key)
        dying = worker_pid(gateway, 1)
        assert dying is not None, gateway.log()
        os.kill(dying, signal.SIGKILL)
        await eventually(lambda: not _alive(dying), within=10)
        statuses = []
        async with httpx.AsyncClient(timeout=5) as client:
            for _ in range(40):
                response = await client.get(f"{gateway.base_url}/key", headers=key.headers)
                statuses.append(response.status_code)
        assert statuses.count(200) >= 40 - ENVOY_WORKERS, statuses
        assert set(statuses) <= {200, 503}, statuses
    finally:
        await asyncio.to_thread(gateway.stop)
