"""`python -m server` and the `gateway` command: a thin entry that imports the CLI only when
run. Worker processes started with `spawn` (server/compute.py) re-run the parent's main
module before their first job; from here that costs nothing, where `server.cli` as the main
module made every worker import the whole CLI (its CPU and memory: docs/performance.md)."""

from __future__ import annotations

import gc
import sys
from collections.abc import Sequence
from typing import NoReturn


def main(argv: Sequence[str] | None = None) -> int:
    from server.cli import main as run

    code = run(argv)
    if argv is None:  # the process's own command line: this is the program, it ends here
        exit_with_frozen_heap(code)
    return code


def exit_with_frozen_heap(code: int) -> NoReturn:
    """End the process with `code`, its teardown's garbage collections made cheap: once the
    command is done, Python would spend a long time (gc_collect_main, seen with perf) in
    repeated collections over the objects of the loaded server while it clears every module.
    `gc.freeze` (documented for this) moves them all out of the collector's reach, so the
    normal exit stays as it is: exit handlers (log and trace flushes) run, the output is
    flushed, non-daemon threads are joined."""
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    sys.exit(main())
