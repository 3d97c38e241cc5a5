"""CPU-bound work off the event loop: decoding audio, the local speech model, the local video
renderer. pocketsphinx holds the GIL for the whole recognition (a thread running one leaves
the event loop's thread without the GIL in one stretch, until the recognition ends), and
PyAV's Python-level decode loop holds it between packets, so threads would still stall every
other request: the work runs in worker processes.

A pool has a fixed number of processes and a bounded queue in front of them: `run` refuses
at once with `PoolBusy` when both are full, so a burst of long jobs never grows an unbounded
backlog and the caller can answer "busy, retry after N seconds" instead of stalling.

Workers are started with `spawn` (a fresh interpreter; forking a process with gRPC's threads
can deadlock), lazily on first use, ignore Ctrl-C (the server drains them), and die with the
server (PR_SET_PDEATHSIG) should it be killed outright."""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import ctypes.util
import logging
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

log = logging.getLogger("gateway.compute")
T = TypeVar("T")
PR_SET_PDEATHSIG = 1


class PoolBusy(Exception):
    """Every worker is busy and the queue is full."""

    def __init__(self, name: str, retry_after: int) -> None:
        super().__init__(f"{name}: every worker is busy")
        self.retry_after = retry_after


class WorkerLost(Exception):
    """A worker process died while running (or before running) this job."""


def _init_worker(parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the server died before the signal was armed
        os._exit(1)


class ComputePool:
    """`workers` processes; at most `workers + queue` jobs admitted at once."""

    def __init__(self, name: str, workers: int, queue: int, retry_after: int = 5) -> None:
        if workers < 1 or queue < 0:
            raise ValueError("a pool needs at least one worker and a non-negative queue")
        self.name = name
        self.workers = workers
        self.capacity = workers + queue
        self.retry_after = retry_after
        self._admitted = 0
        self._executor: concurrent.futures.ProcessPoolExecutor | None = None
        self._closed = False

    @property
    def admitted(self) -> int:
        """Jobs queued or running (a job still counts until its process is done with it)."""
        return self._admitted

    def _pool(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._closed:
            raise RuntimeError(f"{self.name} pool is closed")
        if self._executor is None:
            self._executor = concurrent.futures.ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker,
                initargs=(os.getpid(),),
            )
        return self._executor

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` in a worker process (fn and args must pickle). A job counts
        against the bound until its process is done with it, even if the caller stopped
        waiting (a cancelled request cannot stop a running job)."""
        if self._admitted >= self.capacity:
            raise PoolBusy(self.name, self.retry_after)
        pool = self._pool()
        loop = asyncio.get_running_loop()
        future = pool.submit(fn, *args)
        self._admitted += 1

        def finished(_: concurrent.futures.Future[Any]) -> None:
            try:
                loop.call_soon_threadsafe(self._release)
            except RuntimeError:  # the loop is gone: the server is stopping
                pass

        future.add_done_callback(finished)
        try:
            return await asyncio.wrap_future(future)
        except BrokenProcessPool as exc:
            self._replace(pool)
            raise WorkerLost(f"{self.name}: a worker process died") from exc

    def _release(self) -> None:
        self._admitted -= 1

    def _replace(self, broken: concurrent.futures.ProcessPoolExecutor) -> None:
        """A crashed worker breaks the whole executor: start a fresh one for what follows."""
        if self._executor is broken:
            log.error("%s: a worker process died; starting a new pool", self.name)
            self._executor = None
            broken.shutdown(wait=False, cancel_futures=True)

    async def close(self) -> None:
        """Drop queued jobs, wait for running ones, and end the worker processes."""
        self._closed = True
        if self._executor is not None:
            executor, self._executor = self._executor, None
            await asyncio.to_thread(executor.shutdown, wait=True, cancel_futures=True)


def release_free_memory() -> None:
    """Give the heap's free pages back to the system (glibc's malloc_trim; nothing elsewhere).
    Large request bodies arrive as many small messages: once they are freed the heap keeps
    their pages, interleaved with live objects, until trimmed. Blocking: run it in a thread."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    trim = getattr(libc, "malloc_trim", None)
    if trim is not None:  # glibc only (musl has none)
        trim(0)
