"""`python -m server` and the `gateway` command: a thin entry that imports the CLI only when
run. Worker processes started with `spawn` (server/compute.py) re-run the parent's main
module before their first job; from here that costs nothing, where `server.cli` as the main
module made every worker import the whole CLI (~1.2 s of CPU and ~70 MiB each)."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from server.cli import main as run

    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
