"""A server process loads no decoder: PyAV (with the FFmpeg libraries), numpy, Pillow and
pocketsphinx (~38 MiB of its peak RSS) are imported only where they run — the worker
processes that decode audio or recognize speech, and the first local video render."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("av", "numpy", "PIL", "pocketsphinx")


def test_the_server_process_imports_no_decoder() -> None:
    probe = (
        "import sys, server.app, server.cli; "
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    ).stdout.strip()
    assert loaded == "", f"imported by the server process: {loaded}"
