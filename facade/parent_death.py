"""`python -m facade.parent_death PARENT_PID PROGRAM [ARGS...]`: run PROGRAM so that the
kernel sends it SIGTERM when the gateway process PARENT_PID dies, even by SIGKILL — no
orphaned Envoy or worker keeps its port.

A separate step before exec, rather than a `preexec_fn`: running Python between fork and
exec in a process with gRPC's threads can deadlock or abort (gRPC's fork handlers), while
without `preexec_fn` the child is started with vfork and runs nothing of ours."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print("usage: python -m facade.parent_death PARENT_PID PROGRAM [ARGS...]", file=sys.stderr)
        return 2
    parent, program = int(argv[1]), argv[2:]
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the signal was armed
            return 1
    os.execvp(program[0], program)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
