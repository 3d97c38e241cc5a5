"""`python -m server` and the `gateway` command: a thin entry that imports the CLI only when
run. Worker processes started with `spawn` (server/compute.py) re-run the parent's main
module before their first job; from here that costs nothing, where `server.cli` as the main
module made every worker import the whole CLI (its CPU time and memory, in each worker)."""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from server.cli import main as run

    code = run(argv)
    if argv is None:  # the process's own command line: this is the program, it ends here
        exit_without_teardown(code)
    return code


def exit_without_teardown(code: int) -> None:
    """End the process now, skipping only the interpreter's teardown: once the command is
    done, Python would spend a long time in repeated garbage collections over the objects
    of the loaded server while it clears every module, which every stop would wait for. The
    exit handlers (log and trace flushes) still run, and the output is flushed; with a
    non-daemon thread still running, the normal exit (which joins it) is kept."""
    others = [t for t in threading.enumerate() if t is not threading.main_thread()]
    if any(not thread.daemon for thread in others):
        return
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or gone (a pipe whose reader left)
            pass
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
