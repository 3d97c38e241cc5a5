"""Resident memory of processes, read from /proc: the oracle of the hostile-peer tests
(bounded growth under a burst, given back after it)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path


def rss_bytes(pid: int) -> int:
    """VmRSS of one process (0 once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def children(pid: int) -> list[int]:
    """Direct children of `pid` (every thread's children, as /proc lists them)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def descendants(pid: int) -> list[int]:
    seen: list[int] = []
    todo = [pid]
    while todo:
        current = todo.pop()
        for child in children(current):
            if child not in seen:
                seen.append(child)
                todo.append(child)
    return seen


@dataclass
class RssSampler:
    """Samples one process's RSS every `interval` seconds on a thread until stopped; `peak`
    is the largest seen, `samples` all of them. Use as a context manager."""

    pid: int
    interval: float = 0.05
    samples: list[int] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @property
    def peak(self) -> int:
        return max(self.samples, default=0)

    def __enter__(self) -> RssSampler:
        self.samples.append(rss_bytes(self.pid))
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.samples.append(rss_bytes(self.pid))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.samples.append(rss_bytes(self.pid))


def settle_rss(pid: int, within: float = 10.0, interval: float = 0.25) -> int:
    """The process's RSS once it stops falling (or after `within` seconds): what it kept."""
    last = rss_bytes(pid)
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        time.sleep(interval)
        now = rss_bytes(pid)
        if now >= last:
            return now
        last = now
    return last
