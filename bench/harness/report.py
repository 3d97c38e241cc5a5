"""The report of a benchmark: Markdown tables, the machine and gateway lines, error lines,
the issue's targets, progress on stderr and the JSON file."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.harness.load import CaseResult
from bench.harness.processes import PeakRss

# --- cells and tables -----------------------------------------------------------------------


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def requests_cell(requests: int, hit_time_cap: bool) -> str:
    return f"{requests}" + (" (time cap)" if hit_time_cap else "")


def markdown_table(
    columns: Sequence[str],
    rows: Iterable[Sequence[object]],
    *,
    text: Collection[int] = (0,),
    spaced: bool = False,
) -> str:
    """A Markdown table: the columns at the indexes in `text` left-aligned, the others
    (numbers) right-aligned; `spaced` writes the alignment row as `| --- | ---: |`."""
    rules = ["---" if index in text else "---:" for index in range(len(columns))]
    lines = ["| " + " | ".join(columns) + " |"]
    lines.append("| " + " | ".join(rules) + " |" if spaced else "|" + "|".join(rules) + "|")
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


# --- lines ----------------------------------------------------------------------------------


def kinds(counts: Mapping[str, int]) -> str:
    """Error kinds and their counts, sorted: `HTTP 500 x3, ReadTimeout x1`."""
    return ", ".join(f"{kind} x{count}" for kind, count in sorted(counts.items()))


def error_lines(results: Iterable[CaseResult]) -> list[str]:
    """One line per case that had errors."""
    return [
        f"Errors in {r.path}, concurrency {r.concurrency}: {kinds(r.error_kinds)}"
        for r in results
        if r.error_kinds
    ]


def machine_line(machine: Mapping[str, Any], *more: str) -> str:
    parts = [
        f"Machine: nproc={machine['nproc']}",
        f"CPU: {machine['cpu']}",
        f"Python {machine['python']}",
        f"database: {machine['database']}",
        *more,
    ]
    return ", ".join(parts)


def gateway_lines(workers: int, rss: PeakRss | None) -> list[str]:
    """How the gateway ran, and its peak memory."""
    lines = [f"Gateway: {workers} server process(es) behind one Envoy"]
    if rss is not None:
        lines.append(rss.line())
    return lines


def progress(message: str) -> None:
    """A line on stderr while the run goes on (stdout is the report)."""
    print(message, file=sys.stderr, flush=True)


def case_done(result: CaseResult, *, p50: bool = True) -> None:
    line = f"  done: {result.path}, concurrency {result.concurrency}: "
    line += f"{result.requests_per_second} req/s"
    progress(line + (f", p50 {result.p50_ms} ms" if p50 else ""))


# --- the targets --------------------------------------------------------------------


@dataclass(frozen=True)
class TargetCheck:
    """One of the issue's targets: reported, met or not, never a failure of the run."""

    name: str
    value: float | None  # None: not measured
    met: bool | None

    def line(self, unit: str) -> str:
        if self.value is None or self.met is None:
            return f"- {self.name}: not measured"
        return f"- {self.name}: {self.value:.2f} {unit}, {'met' if self.met else 'NOT met'}"


# --- the machine ----------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _nproc() -> int:
    if shutil.which("nproc"):
        done = subprocess.run(["nproc"], capture_output=True, text=True, check=False)
        if done.returncode == 0 and done.stdout.strip().isdigit():
            return int(done.stdout.strip())
    return len(os.sched_getaffinity(0))


def machine_info(database: str) -> dict[str, Any]:
    return {
        "nproc": _nproc(),
        "cpu": _cpu_model(),
        "python": platform.python_version(),
        "database": database,
    }


# --- JSON -----------------------------------------------------------------------------------


def load_settings(args: argparse.Namespace, **more: object) -> dict[str, Any]:
    """The settings of --requests, --warmup, --time-cap and --concurrency, then `more`."""
    return {
        "requests": args.requests,
        "warmup": args.warmup,
        "time_cap_seconds": args.time_cap,
        "concurrency": args.concurrency,
        **more,
    }


def rss_json(rss: PeakRss | None) -> dict[str, Any] | None:
    return None if rss is None else asdict(rss)


def write_json(
    path: Path | None,
    benchmark: str,
    settings: Mapping[str, Any],
    machine: Mapping[str, Any],
    peak_rss: object,
    **sections: object,
) -> None:
    """The --json file (if one was asked for): the benchmark's name, settings, machine and
    peak RSS, then its own sections."""
    if path is None:
        return
    payload = {
        "benchmark": benchmark,
        "settings": settings,
        "machine": machine,
        "peak_rss": peak_rss,
        **sections,
    }
    path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
