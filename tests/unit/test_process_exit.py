"""The `gateway` process ends with its teardown's collections made cheap (server/__main__.py),
and still runs its exit handlers, flushes its output, joins its threads and keeps its exit
status."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """
import atexit, sys, threading
from server.__main__ import exit_with_frozen_heap
atexit.register(lambda: print("exit handler ran", end=""))
print("buffered output,", end=" ")
if sys.argv[1] == "thread":
    release = threading.Event()
    threading.Thread(target=release.wait, args=(2,)).start()  # a non-daemon thread
    threading.Timer(0.2, release.set).start()
    exit_with_frozen_heap(3)
exit_with_frozen_heap(3)
print("not reached")
"""


def run(case: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROGRAM, case],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def test_the_exit_handlers_run_and_the_output_is_flushed() -> None:
    ran = run("plain")
    assert (ran.returncode, ran.stdout) == (3, "buffered output, exit handler ran"), ran.stderr


def test_a_running_non_daemon_thread_is_joined() -> None:
    ran = run("thread")
    assert (ran.returncode, ran.stdout) == (3, "buffered output, exit handler ran"), ran.stderr
