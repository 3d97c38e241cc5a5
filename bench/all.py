"""Run every benchmark on SQLite and PostgreSQL with 1 and 2 server processes (issue 7) and
print one table: GET /key, transcription (with the latency the gateway adds), video
submissions and the limit checks, with requests/s, p50, p99 and the gateway's peak RSS.

Each run is `python -m bench.<name> ... --workers N --json FILE` in a subprocess of its own
(each starts and stops its own gateway, fake providers and database); this script only reads
their JSON. The whole run is bounded: every run gets at most RUN_CAP seconds and all of them
together the --budget (20 minutes by default); a run over its time is stopped (SIGTERM, it
stops what it started; after a grace period SIGKILL to it and the processes it had started,
by PID) and reported, and runs with no time left are skipped and reported. Figures from a
machine that is busy with anything else are not worth publishing.

Run from the repository root:

    python -m bench.all                     # print the table (about 12 min on 2 cores)
    python -m bench.all --docs              # ... and write it into docs/performance.md
    python -m bench.all --requests 100 --backends sqlite --workers 1   # a quick check

Peak RSS is VmHWM (/proc/<pid>/status) of the gateway's processes - `gateway up`, its server
worker processes and Envoy - read at the end of each benchmark run (so over all its cases)
before the gateway is stopped; the table gives the Python server processes' sum and Envoy.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness.cli import positive_int
from bench.harness.processes import (
    DEFAULT_PG_ADMIN_URL,
    REPO_ROOT,
    exit_on_sigterm,
    kill_tree,
    terminate,
)
from bench.harness.report import fmt, kinds, markdown_table
from bench.key_status import REST_PATH
from bench.limits import MODELS, NO_LIMITS
from bench.transcription import GATEWAY_PATH

PERFORMANCE_PAGE = REPO_ROOT / "docs" / "performance.md"
START_MARKER = "<!-- bench:all:start -->"
END_MARKER = "<!-- bench:all:end -->"
SQLITE = "SQLite"
POSTGRESQL = "PostgreSQL"
BACKENDS = {"sqlite": SQLITE, "postgresql": POSTGRESQL}
BENCHMARKS = ("key_status", "transcription", "videos", "limits")
CONCURRENCY = 16
RUN_CAP = 300.0  # seconds for one benchmark run (its own per-case caps keep it well below)
MIN_RUN_SECONDS = 60.0  # a run with less time left than this is skipped
STOP_GRACE = 45.0  # seconds a stopped run gets to stop its gateway before SIGKILL
TIME_CAP = 30.0  # per case, passed to every benchmark


def benchmark_arguments(benchmark: str, requests: int) -> list[str]:
    """The settings of one benchmark in this run (also printed with the table)."""
    common = ["--requests", str(requests), "--warmup", str(max(1, requests // 10))]
    common += ["--time-cap", f"{TIME_CAP:g}"]
    if benchmark == "limits":
        return [*common, "--concurrency", str(CONCURRENCY), "--rounds", "5"]
    both = ["--concurrency", "1", str(CONCURRENCY)]
    if benchmark == "videos":
        return [*common, *both, "--webhook-jobs", "0"]  # the table has submissions only
    return [*common, *both]


@dataclass(frozen=True)
class Run:
    benchmark: str
    backend: str  # SQLITE | POSTGRESQL
    workers: int

    @property
    def name(self) -> str:
        return f"{self.benchmark}-{self.backend.lower()}-{self.workers}"


@dataclass
class Outcome:
    run: Run
    status: str  # "ok", "errors", "failed (exit N)", "timed out", "skipped (...)"
    seconds: float = 0.0
    payload: dict[str, Any] | None = None
    log_tail: str = ""


# --- running the benchmarks -----------------------------------------------------------------


def stop(child: subprocess.Popen[bytes]) -> None:
    """SIGTERM the benchmark, which stops what it started; if it has not exited after
    STOP_GRACE, SIGKILL it and each process it had started, by PID."""
    if not terminate(child, STOP_GRACE):
        kill_tree(child)


def execute(run: Run, arguments: list[str], out_dir: Path, timeout: float) -> Outcome:
    json_path = out_dir / f"{run.name}.json"
    log_path = out_dir / f"{run.name}.log"
    argv = [sys.executable, "-m", f"bench.{run.benchmark}", *arguments]
    argv += ["--workers", str(run.workers), "--json", str(json_path)]
    started = time.monotonic()
    with open(log_path, "wb") as log:
        child = subprocess.Popen(
            argv, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            code = child.wait(timeout)
            status = "ok" if code == 0 else f"exit {code}"
        except subprocess.TimeoutExpired:
            stop(child)
            status = f"timed out after {timeout:.0f} s"
        except BaseException:  # SIGTERM or Ctrl-C of this script: stop the run too
            stop(child)
            raise
    seconds = round(time.monotonic() - started, 1)
    payload = json.loads(json_path.read_text()) if json_path.exists() else None
    if payload is not None and status == "exit 1":
        status = "errors"  # the benchmark's own verdict: some responses were not 2xx
    tail = "" if status == "ok" else "".join(log_path.read_text().splitlines(True)[-15:])
    return Outcome(run, status, seconds, payload, tail)


# --- the table ------------------------------------------------------------------------------


@dataclass
class Row:
    benchmark: str
    backend: str
    processes: int
    concurrency: int
    requests_per_second: float | None
    p50_ms: float | None
    p99_ms: float | None
    rss: dict[str, Any] | None
    errors: int
    order: tuple[int, ...] = field(default=(), repr=False)


def _backend_label(run: Run, payload: dict[str, Any]) -> str:
    if run.backend == SQLITE:
        return SQLITE
    version = re.search(r"PostgreSQL (\d+)", payload.get("machine", {}).get("database", ""))
    return f"{POSTGRESQL} {version.group(1)}" if version else POSTGRESQL


def rows_of(outcome: Outcome) -> list[Row]:
    run, payload = outcome.run, outcome.payload
    if payload is None:
        return []
    backend = _backend_label(run, payload)
    place = (
        BENCHMARKS.index(run.benchmark),
        list(BACKENDS.values()).index(run.backend),
        run.workers,
    )
    rows: list[Row] = []

    def add(label: str, case: dict[str, Any], rps: float, rss: Any, extra: int = 0) -> None:
        rows.append(
            Row(
                label,
                backend,
                run.workers,
                case["concurrency"],
                rps,
                case["p50_ms"],
                case["p99_ms"],
                rss,
                case["errors"],
                (*place, case["concurrency"], extra),
            )
        )

    rss = payload.get("peak_rss")
    if run.benchmark == "key_status":
        for case in payload["results"]:
            if case["path"] == REST_PATH:
                add("GET /api/v1/key", case, case["requests_per_second"], rss)
    elif run.benchmark == "transcription":
        for case in payload["results"]:
            if case["path"] == GATEWAY_PATH:
                added = payload["added_p50_ms"].get(str(case["concurrency"]))
                label = f"POST /audio/transcriptions (added p50 {fmt(added)} ms)"
                add(label, case, case["requests_per_second"], rss)
    elif run.benchmark == "videos":
        for case in payload["submissions"]:
            add("POST /videos (202 accepted)", case, case["accepted_per_second"], rss)
    elif run.benchmark == "limits":
        for case in payload["results"]:
            label = f"limits: {MODELS[case['model']]} model, {case['limits']}"
            cost = payload["throughput_cost"].get(case["model"])
            if case["limits"] != NO_LIMITS.name and cost is not None:
                label += f" (cost {cost:.1%})"
            rss_of_gateway = (rss or {}).get(case["limits"])
            # Each model's two gateways next to each other, limits enforced first.
            order = list(MODELS).index(case["model"]) * 2 + (case["limits"] == NO_LIMITS.name)
            add(label, case, case["served_per_second"], rss_of_gateway, order)
    return rows


def _rss_cell(rss: dict[str, Any] | None) -> str:
    if not rss:
        return "-"
    return f"{rss['server_mib']:.0f} + {rss['envoy_mib']:.0f}"


def summary_table(rows: Sequence[Row]) -> str:
    columns = ["benchmark", "backend", "processes", "concurrency", "req/s", "p50 ms", "p99 ms"]
    return markdown_table(
        [*columns, "peak RSS MiB (server + Envoy)"],
        [
            [
                row.benchmark + (f" ({row.errors} errors)" if row.errors else ""),
                row.backend,
                row.processes,
                row.concurrency,
                "-" if row.requests_per_second is None else f"{row.requests_per_second:.0f}",
                fmt(row.p50_ms),
                fmt(row.p99_ms),
                _rss_cell(row.rss),
            ]
            for row in sorted(rows, key=lambda r: r.order)
        ],
        text=(0, 1),
        spaced=True,
    )


def settings_line(benchmarks: Sequence[str], requests: int) -> str:
    parts = [f"`{name} {' '.join(benchmark_arguments(name, requests))}`" for name in benchmarks]
    return "Settings: " + "; ".join(parts) + "."


def machine_line(outcomes: Sequence[Outcome]) -> str:
    machine = next((o.payload["machine"] for o in outcomes if o.payload), None)
    if machine is None:
        return "Machine: unknown (no benchmark finished)"
    databases = sorted({o.payload["machine"]["database"] for o in outcomes if o.payload})
    return (
        f"Machine: nproc={machine['nproc']}, CPU: {machine['cpu']}, Python {machine['python']}; "
        f"databases: {'; '.join(databases)}. The load generator, Envoy, the servers and the "
        "database share the machine."
    )


def notes(outcomes: Sequence[Outcome]) -> list[str]:
    lines = []
    for outcome in outcomes:
        if outcome.status != "ok":
            lines.append(
                f"- {outcome.run.benchmark}, {outcome.run.backend}, {outcome.run.workers} "
                f"process(es): {outcome.status}"
            )
        for key in ("results", "submissions"):
            for case in (outcome.payload or {}).get(key, ()):
                where = (
                    f"- {outcome.run.benchmark}, {outcome.run.backend}, {outcome.run.workers} "
                    f"process(es), {case['path']}, concurrency {case['concurrency']}"
                )
                if case.get("error_kinds"):
                    lines.append(f"{where}: errors {kinds(case['error_kinds'])}")
                if case.get("hit_time_cap"):
                    lines.append(
                        f"{where}: stopped by the {TIME_CAP:g} s time cap after "
                        f"{case['requests']} of {case['target_requests']} requests"
                    )
    return lines


def section(
    outcomes: Sequence[Outcome], benchmarks: Sequence[str], requests: int, total_seconds: float
) -> str:
    rows = [row for outcome in outcomes for row in rows_of(outcome)]
    day = datetime.datetime.now(datetime.UTC).date().isoformat()
    lines = [
        f"`python -m bench.all`, {day}, {total_seconds / 60:.1f} min. "
        + settings_line(benchmarks, requests),
        "",
        summary_table(rows),
        "",
        machine_line(outcomes),
        "Peak RSS: VmHWM of the gateway's processes over the whole benchmark run, read before "
        "it stopped: the Python server processes (`gateway up`, plus its N workers when N > 1) "
        "summed, and Envoy; shared pages count in each process. Transcription and limits use "
        "a fast fake provider; video submissions use a model the worker fails at once.",
    ]
    problems = notes(outcomes)
    if problems:
        lines += ["", "Not clean:", *problems]
    return "\n".join(lines)


def write_page(text: str, page: Path = PERFORMANCE_PAGE) -> None:
    """Replace the page's current figures (between the markers) with `text`; the dated
    history below them is kept (move the old figures there by hand)."""
    document = page.read_text(encoding="utf-8")
    start, end = document.find(START_MARKER), document.find(END_MARKER)
    if start < 0 or end < start:
        raise ValueError(f"{page} has no {START_MARKER} ... {END_MARKER} section")
    before = document[: start + len(START_MARKER)]
    page.write_text(f"{before}\n{text}\n{document[end:]}", encoding="utf-8")


# --- main -----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.all",
        description="Run every benchmark on SQLite and PostgreSQL with 1 and 2 server processes "
        "and print one table.",
    )
    parser.add_argument(
        "--docs",
        action="store_true",
        help=f"replace the current figures ({START_MARKER}) of docs/performance.md",
    )
    parser.add_argument(
        "--requests", type=positive_int, default=1000, help="measured requests per case (1000)"
    )
    parser.add_argument(
        "--budget", type=float, default=1200.0, help="seconds for all runs together (1200)"
    )
    parser.add_argument(
        "--backends", nargs="+", choices=tuple(BACKENDS), default=list(BACKENDS), metavar="B"
    )
    parser.add_argument("--workers", nargs="+", type=positive_int, default=[1, 2])
    parser.add_argument(
        "--benchmarks", nargs="+", choices=BENCHMARKS, default=list(BENCHMARKS), metavar="NAME"
    )
    parser.add_argument(
        "--database-url",
        default=DEFAULT_PG_ADMIN_URL,
        help=f"the PostgreSQL server's admin database ({DEFAULT_PG_ADMIN_URL})",
    )
    parser.add_argument(
        "--output-dir", type=Path, help="keep each run's JSON and log here (default: discarded)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    runs = [
        Run(benchmark, BACKENDS[backend], workers)
        for backend in args.backends
        for workers in args.workers
        for benchmark in args.benchmarks
    ]
    print(settings_line(args.benchmarks, args.requests), file=sys.stderr)
    print(
        f"{len(runs)} runs, at most {RUN_CAP:.0f} s each and {args.budget:.0f} s in all",
        file=sys.stderr,
        flush=True,
    )
    started = time.monotonic()
    deadline = started + args.budget
    outcomes: list[Outcome] = []
    with contextlib.ExitStack() as cleanup:
        out_dir = args.output_dir
        if out_dir is None:
            out_dir = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="bench-all-")))
        out_dir.mkdir(parents=True, exist_ok=True)
        for run in runs:
            left = deadline - time.monotonic()
            if left < MIN_RUN_SECONDS:
                outcomes.append(Outcome(run, f"skipped (time budget, {left:.0f} s left)"))
                continue
            arguments = benchmark_arguments(run.benchmark, args.requests)
            if run.backend == POSTGRESQL:
                arguments += ["--database-url", args.database_url]
            outcome = execute(run, arguments, out_dir, min(RUN_CAP, left))
            outcomes.append(outcome)
            print(
                f"  {run.name}: {outcome.status} in {outcome.seconds} s",
                file=sys.stderr,
                flush=True,
            )
            if outcome.log_tail:
                print(outcome.log_tail, file=sys.stderr, flush=True)
    text = section(outcomes, args.benchmarks, args.requests, time.monotonic() - started)
    print(text)
    if args.docs:
        write_page(text)
        print(f"Wrote the table into {PERFORMANCE_PAGE}", file=sys.stderr)
    return 0 if all(o.status == "ok" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
