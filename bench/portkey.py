"""Portkey's open-source AI gateway as the second peer of bench.hotpath (issue 31): the npm
package `@portkey-ai/gateway`, installed into a folder of its own (.bench-cache/portkey,
gitignored; `npm install` took about 10 s here), run by Node.js as one process
(`node build/start-server.js --port=N --headless`: no UI, no log stream), a pure proxy with
no keys, no metering and no database. Each request names its upstream in headers:
`x-portkey-provider: openai` and `x-portkey-custom-host: http://127.0.0.1:PORT/v1` (the fast
fake provider); Portkey sends the multipart upload on to `<custom host>/audio/transcriptions`
with the request's `Authorization` (the fake's key). 127.0.0.1 is among the custom hosts its
SSRF check trusts by default, so nothing needs configuring.

Node.js and npm come from the machine (Debian: `apt-get install nodejs npm`); the bench
installs nothing system-wide, and without them it says so and runs without Portkey.

    python -m bench.portkey          # install or check the package only

Version: 1.15.2, the newest the npm registry served here on 2026-11-27. Installed with
`--ignore-scripts`: the package's only install script is patch-package, whose patches are not
in the published package, so no third-party code runs at install.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from bench.harness.load import LOOPBACK
from bench.harness.processes import REPO_ROOT, LoopbackPeer
from bench.harness.stt import FakeProviderProcess
from testkit.processes import free_port

VERSION = "1.15.2"
PACKAGE = "@portkey-ai/gateway"
DIRECTORY = REPO_ROOT / ".bench-cache" / "portkey"
ENTRY = Path("node_modules", "@portkey-ai", "gateway", "build", "start-server.js")
INSTALL_TIMEOUT = 600.0  # seconds: npm's own retries on a slow registry stay within it
# Portkey's start-server takes a port, not a host, and Node listens on every interface when
# given none: this preload gives such a listen 127.0.0.1, so the peer serves loopback only
# (percent-encoded: in a data: URL a "?" would start a query).
LOOPBACK_PRELOAD = "data:text/javascript," + quote(
    "import net from 'node:net';"
    "const listen = net.Server.prototype.listen;"
    "net.Server.prototype.listen = function (...args) {"
    " if (typeof args[0] === 'number' && typeof args[1] !== 'string')"
    "  args.splice(1, args[1] === undefined ? 1 : 0, '127.0.0.1');"
    " return listen.apply(this, args); };"
)


def missing_tools(which: Callable[[str], str | None] = shutil.which) -> str | None:
    """A line saying what is missing to run Portkey (None: node and npm are both there)."""
    missing = [tool for tool in ("node", "npm") if which(tool) is None]
    if not missing:
        return None
    return (
        f"Portkey skipped: {', '.join(missing)} not found on PATH; it needs Node.js and npm "
        "(Debian: apt-get install nodejs npm). The bench installs nothing system-wide."
    )


def installed_version(directory: Path) -> str | None:
    """The version of @portkey-ai/gateway installed under `directory`, if any."""
    package = directory / ENTRY.parent.parent / "package.json"
    try:
        version = json.loads(package.read_text(encoding="utf-8")).get("version")
    except (OSError, ValueError, AttributeError):
        return None
    return version if isinstance(version, str) else None


def ensure_installed(directory: Path = DIRECTORY) -> Path:
    """Portkey's start script, installing the pinned version first when it is missing."""
    if installed_version(directory) == VERSION:
        return directory / ENTRY
    print(f"Installing {PACKAGE}@{VERSION} into {directory}...", file=sys.stderr, flush=True)
    started = time.monotonic()
    directory.mkdir(parents=True, exist_ok=True)
    manifest = directory / "package.json"
    if not manifest.exists():  # npm's project root: without one it looks in the parents
        manifest.write_text('{"private": true}\n', encoding="utf-8")
    done = subprocess.run(
        [
            "npm",
            "install",
            "--prefix",
            str(directory),
            "--ignore-scripts",
            "--no-audit",
            "--no-fund",
            "--save-exact",
            f"{PACKAGE}@{VERSION}",
        ],
        stdin=subprocess.DEVNULL,
        timeout=INSTALL_TIMEOUT,
        check=False,
    )
    if done.returncode != 0 or installed_version(directory) != VERSION:
        raise RuntimeError(
            f"npm install {PACKAGE}@{VERSION} failed (exit {done.returncode}); "
            "run with --no-portkey to measure without it"
        )
    print(f"installed in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return directory / ENTRY


def portkey_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """Portkey's environment: the caller's, less what would send its calls elsewhere or
    refuse the fake (proxies, another list of trusted custom hosts, Node options)."""
    dropped = {"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NODE_OPTIONS", "PORT"}
    env = {name: value for name, value in environ.items() if name.upper() not in dropped}
    env["TRUSTED_CUSTOM_HOSTS"] = LOOPBACK  # its default list holds it too; said, not assumed
    env["NO_PROXY"] = "*"
    return env


def provider_headers(provider_base_url: str) -> dict[str, str]:
    """The headers that send a request through Portkey to an OpenAI-compatible provider."""
    return {"x-portkey-provider": "openai", "x-portkey-custom-host": provider_base_url}


@dataclass
class PortkeyGateway(LoopbackPeer):
    provider: FakeProviderProcess
    work_dir: Path
    process: subprocess.Popen[bytes] | None = None
    port: int = 0

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}/v1"

    @property
    def headers(self) -> dict[str, str]:
        return provider_headers(self.provider.base_url)

    def start(self, ready_within: float = 60.0) -> PortkeyGateway:
        entry = ensure_installed()
        node = shutil.which("node")
        if node is None:
            raise RuntimeError(missing_tools() or "node not found")
        self.port = free_port()
        log_path = self.work_dir / "portkey.log"
        log = open(log_path, "wb")  # lives with the process
        self.process = subprocess.Popen(
            [node, "--import", LOOPBACK_PRELOAD, str(entry), f"--port={self.port}", "--headless"],
            cwd=entry.parent,
            env=portkey_environment(os.environ),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        print("Starting Portkey...", file=sys.stderr, flush=True)
        # GET / answers "AI Gateway says hey!" once the server listens.
        self.await_ready("Portkey", "/", ready_within, log_path)
        return self


if __name__ == "__main__":
    line = missing_tools()
    if line is not None:
        print(line, file=sys.stderr)
        sys.exit(1)
    print(ensure_installed())
