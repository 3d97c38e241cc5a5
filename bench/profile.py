"""Where a request's time goes: a per-phase CPU profile of GET /key and of one transcription
through the gateway (issue 17's "before" picture for the hot-path redesign).

Starts the fast fake provider and a gateway (`gateway up`, one server process, SQLite, a
funded key), then for each path runs a bounded load (`--concurrency`, 4 by default; `--requests`, a
time
cap) while `py-spy record --format raw --subprocesses` samples the server process (and its
decode workers). Each sampled stack is put in one phase by the deepest frame that names one
(the rules below: auth/principal lookup, admission, audio decode/probe, provider call,
settlement/ledger, generation record, GET /key status, response building, gRPC framing);
samples in SQLite's driver thread are a phase of their own. Envoy's and the server's CPU
seconds over the load come from /proc, so the table shows CPU milliseconds per request:
Envoy, then the server's share of each phase. Samples of a stack that also runs ORM or
driver code (sqlalchemy, aiosqlite, asyncpg) are counted again in the "of which SQL" column.

    python -m bench.profile                  # 600 requests per path
    python -m bench.profile --requests 1000 --json profile.json

py-spy (`pip install '.[bench]'`) needs ptrace on the server process (it works in this
sandbox as root). Only
127.0.0.1 is contacted; the processes started are stopped by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.harness.cli import positive_int
from bench.harness.load import (
    Call,
    CaseResult,
    LeanHttpClient,
    bearer,
    lean_call,
    loopback_client,
    measure,
)
from bench.harness.processes import (
    ENVOY_COMMAND,
    create_funded_key,
    process_tree,
    run_database,
    running_gateway,
    scratch,
    terminate,
)
from bench.harness.report import markdown_table
from bench.harness.stt import (
    BENCH_MODEL,
    ROUTE,
    multipart_upload,
    running_fake_provider,
    write_catalog,
)
from testkit.audio import speech
from testkit.catalog import FAKE_KEY_ENV

CONCURRENCY = 4
SAMPLE_RATE = 250  # per second

# (phase, substrings of a frame "function (file:line)"): the deepest frame matching any
# rule decides, so a rule for a callee wins over its caller's.
PHASE_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("gRPC framing / handler dispatch", ("grpc/", "google/protobuf", "_cython")),
    ("response building", ("server/services/", "json_format", "json/encoder")),
    # the REST listener (server/rest/, aiohttp): its request, the body read from its stream,
    # its answer written
    ("REST listener (aiohttp, the body read)", ("server/rest/", "aiohttp/")),
    ("auth / principal lookup", ("server/auth.py", "server/accounts/")),
    ("GET /key status", ("server/limits/key_status.py",)),
    (
        "admission (limits, guardrails, hold)",
        (
            "server/limits/",
            "server/guardrails/",
            "server/byok/",
            "billing/holds.py (place_hold",
            "place_hold",
            "admit (",
        ),
    ),
    (
        "audio decode / probe",
        (
            "server/audio_decoding.py",
            "server/transcription/media.py",
            "server/compute.py",
            "_probe (",
            "av/",
        ),
    ),
    ("request parsing", ("server/transcription/request.py", "server/validation.py")),
    (
        "provider call",
        (
            "server/providers/",
            "server/routing/",
            "httpx/",
            "httpcore/",
            "h11/",
        ),
    ),
    # The writer's own BEGIN and COMMIT (a unit's statements are its caller's phase: the
    # deepest frame that names one wins).
    ("group commit (the writer's BEGIN and COMMIT)", ("server/db/writer.py",)),
    # InlineSqlite's WAL checkpoints: a thread of their own, beside the batches.
    ("WAL checkpoint (a thread beside the batches)", ("_checkpoint (server/db/driver.py",)),
    ("settlement / ledger", ("_settle (", "server/billing/ledger.py", "settle_hold", "drop_hold")),
    ("generation record", ("server/observability/generations.py",)),
    ("failure path", ("_fail (",)),
    (
        "observability (logs, metrics, traces)",
        (
            "server/observability/logs.py",
            "server/observability/metrics.py",
            "server/observability/tracing.py",
            "prometheus_client",
            "opentelemetry",
            "logging/",
        ),
    ),
)
# server/db/driver.py: the writer runs SQLite statements inline on the loop (InlineSqlite).
SQL_MARKERS = ("sqlalchemy/", "aiosqlite/", "asyncpg/", "sqlite3/", "server/db/driver.py")
# A leaf frame that is a wait, not work: py-spy (on a loaded machine especially) samples
# some of them as active. Left out of the shares.
IDLE_LEAVES = (
    "EpollSelector.select",
    "_PollLikeSelector.select",
    "Condition.wait",
    "SemLock.__enter__",
    "Queue.get (",
    "wait_result_broken_or_wakeup",
    "Event.wait",
    "_wait_for_tstate_lock",
)
IDLE = "idle (waiting: epoll, locks, queues)"
# The decode pool's inter-process traffic: the audio pickled to a worker process and the
# answer back (multiprocessing), in the server process's own threads.
POOL_IPC_MARKERS = (
    "multiprocessing/connection.py",
    "multiprocessing/queues.py",
    "_sendback_result",
    "ForkingPickler",
    "concurrent/futures/process.py",
)
POOL_IPC = "decode pool IPC (audio pickled to the worker process and back)"
ORM_UNATTRIBUTED = "ORM / SQL, caller not visible (greenlet boundary)"
SQLITE_THREAD = "SQLite driver thread (aiosqlite)"
EVENT_LOOP = "event loop / other"


def phase_of(frames: Sequence[str]) -> str:
    """The phase of one stack, frames from the root to the leaf."""
    if frames and any(frames[-1].startswith(leaf) for leaf in IDLE_LEAVES):
        return IDLE
    phase: str | None = None
    for frame in frames:
        for name, markers in PHASE_RULES:
            if any(marker in frame for marker in markers):
                phase = name
                break
    if phase is not None:
        return phase
    if any("aiosqlite/core.py" in frame for frame in frames):
        return SQLITE_THREAD
    if any(marker in frame for frame in frames for marker in POOL_IPC_MARKERS):
        return POOL_IPC
    if any(marker in frame for frame in frames for marker in SQL_MARKERS):
        return ORM_UNATTRIBUTED
    return EVENT_LOOP


@dataclass
class Breakdown:
    samples: Counter[str]
    sql_samples: Counter[str]

    @property
    def total(self) -> int:
        """Samples of work (idle ones left out)."""
        return sum(count for phase, count in self.samples.items() if phase != IDLE)


def parse_raw(text: str) -> Breakdown:
    """py-spy's raw (collapsed) output: `frame;frame;... count` per line, root first."""
    samples: Counter[str] = Counter()
    sql: Counter[str] = Counter()
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        frames = stack.split(";")
        phase = phase_of(frames)
        samples[phase] += int(count_text)
        if any(marker in frame for frame in frames for marker in SQL_MARKERS):
            sql[phase] += int(count_text)
    return Breakdown(samples, sql)


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process, from /proc; 0 once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_by_role(root_pid: int) -> dict[int, tuple[bool, float]]:
    """Each process of the tree: (is Envoy, CPU seconds so far)."""
    return {pid: (_comm(pid) == ENVOY_COMMAND, cpu_seconds(pid)) for pid in process_tree(root_pid)}


def cpu_spent(
    before: dict[int, tuple[bool, float]], after: dict[int, tuple[bool, float]]
) -> tuple[float, float]:
    """(Envoy, server) CPU seconds between two readings; a process started in between (a
    decode worker) counts from its start."""
    envoy = server = 0.0
    for pid, (is_envoy, seconds) in after.items():
        spent = seconds - before.get(pid, (is_envoy, 0.0))[1]
        if is_envoy:
            envoy += spent
        else:
            server += spent
    return envoy, server


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text(encoding="utf-8").strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class PathProfile:
    path: str
    load: CaseResult
    envoy_cpu_ms: float  # per request
    server_cpu_ms: float  # per request
    phases: dict[str, float]  # share of the server's samples
    sql_phases: dict[str, float]


async def _load(call: Call, path: str, args: argparse.Namespace) -> CaseResult:
    return await measure(path, call, args.concurrency, args.requests, 0, args.time_cap)


def profile_path(
    name: str,
    server_pid: int,
    load: Callable[[str], Coroutine[Any, Any, CaseResult]],
    args: argparse.Namespace,
    out: Path,
) -> PathProfile:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists():
        raise SystemExit("bench.profile needs py-spy: pip install '.[bench]'")
    recorder = subprocess.Popen(
        [
            py_spy,
            "record",
            "--pid",
            str(server_pid),
            "--subprocesses",
            "--format",
            "raw",
            "--rate",
            str(args.rate),
            # py-spy reads C frames only while the process is paused
            *(["--native"] if args.native else ["--nonblocking"]),
            "--output",
            str(out),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    time.sleep(1.0)  # py-spy attaches
    before = cpu_by_role(server_pid)
    result = asyncio.run(load(name))
    envoy_cpu, server_cpu = cpu_spent(before, cpu_by_role(server_pid))
    recorder.send_signal(2)  # SIGINT: py-spy writes its output and exits
    try:
        recorder.wait(30)
    except subprocess.TimeoutExpired:
        terminate(recorder, 5)
    if not out.exists():
        stderr = recorder.stderr.read().decode() if recorder.stderr else ""
        raise RuntimeError(f"py-spy wrote no profile: {stderr}")
    breakdown = parse_raw(out.read_text(encoding="utf-8"))
    done = max(1, result.requests)
    total = max(1, breakdown.total)
    return PathProfile(
        name,
        result,
        round(envoy_cpu * 1000 / done, 3),
        round(server_cpu * 1000 / done, 3),
        {
            phase: round(count / total, 4)
            for phase, count in breakdown.samples.most_common()
            if phase != IDLE
        },
        {phase: round(count / total, 4) for phase, count in breakdown.sql_samples.most_common()},
    )


def report(profiles: Sequence[PathProfile], concurrency: int) -> str:
    blocks: list[str] = []
    for p in profiles:
        rows: list[list[object]] = [["Envoy (whole process)", "-", f"{p.envoy_cpu_ms:.2f}", "-"]]
        for phase, share in p.phases.items():
            sql = p.sql_phases.get(phase, 0.0)
            rows.append(
                [
                    phase,
                    f"{share * 100:.1f}%",
                    f"{share * p.server_cpu_ms:.2f}",
                    f"{sql * p.server_cpu_ms:.2f}",
                ]
            )
        rows.append(
            [
                "server total",
                "100%",
                f"{p.server_cpu_ms:.2f}",
                f"{sum(p.sql_phases.values()) * p.server_cpu_ms:.2f}",
            ]
        )
        blocks.append(
            f"{p.path}: {p.load.requests} requests at concurrency {concurrency}, "
            f"{p.load.requests_per_second:.0f} req/s, p50 {p.load.p50_ms} ms, "
            f"{p.load.errors} errors\n\n"
            + markdown_table(
                ["phase", "share of server samples", "CPU ms / request", "of which SQL ms"], rows
            )
        )
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return "\n\n".join(blocks) + f"\n\nLoad average at the end: {load}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("--requests", type=positive_int, default=600)
    parser.add_argument("--time-cap", type=float, default=30.0)
    parser.add_argument(
        "--concurrency", type=positive_int, default=CONCURRENCY, help=f"({CONCURRENCY})"
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--raw-dir", type=Path, help="keep py-spy's raw stacks here")
    parser.add_argument(
        "--rate",
        type=positive_int,
        default=SAMPLE_RATE,
        help=f"py-spy's samples per second ({SAMPLE_RATE}; more sample a short run finer, at "
        "more of the server's CPU)",
    )
    parser.add_argument(
        "--native",
        action="store_true",
        help="sample C frames too (gRPC's core, SQLite): slower sampling, fewer samples",
    )
    args = parser.parse_args(argv)
    audio = speech(1.0)
    profiles: list[PathProfile] = []
    with (
        scratch("bench-profile-") as tmp,
        run_database(None, tmp / "data") as database,
        running_fake_provider() as fake,
        running_gateway(
            tmp / "data",
            database,
            1,
            {
                "GATEWAY_CATALOG": str(write_catalog(tmp / "catalog.toml", fake.base_url)),
                FAKE_KEY_ENV: fake.api_key,
            },
        ) as run,
    ):
        key = create_funded_key(tmp / "data", database.url)
        gateway = run.gateway
        assert gateway.process is not None
        upload = multipart_upload(BENCH_MODEL, audio)

        async def get_key(path: str) -> CaseResult:
            async with loopback_client(gateway.base_url, bearer(key), args.concurrency) as client:

                async def call() -> str | None:
                    response = await client.get("/key")
                    return None if response.status_code == 200 else f"HTTP {response.status_code}"

                return await _load(call, path, args)

        async def transcribe(path: str) -> CaseResult:
            async with LeanHttpClient(
                gateway.base_url + ROUTE, [key], upload.content_type, upload.content
            ) as client:
                return await _load(lean_call(client), path, args)

        profiles.append(
            profile_path("GET /api/v1/key", gateway.process.pid, get_key, args, tmp / "key.txt")
        )
        profiles.append(
            profile_path(
                "POST /api/v1/audio/transcriptions (32 KB WAV)",
                gateway.process.pid,
                transcribe,
                args,
                tmp / "stt.txt",
            )
        )
        if args.raw_dir is not None:
            args.raw_dir.mkdir(parents=True, exist_ok=True)
            for name in ("key.txt", "stt.txt"):
                shutil.copy(tmp / name, args.raw_dir / name)
    print(report(profiles, args.concurrency))
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {"load_average": os.getloadavg(), "profiles": [asdict(p) for p in profiles]},
                indent=2,
            )
            + "\n",
            encoding="utf-8",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
