"""The command-line options every benchmark takes, written once."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from bench.harness.processes import DEFAULT_PG_ADMIN_URL


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {text!r}")
    return value


def count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {text!r}")
    return value


def add_load_arguments(
    parser: argparse.ArgumentParser,
    requests: int,
    warmup: int,
    noun: str = "requests",
    zero_skips: str | None = None,
) -> None:
    """--requests, --warmup and --time-cap: how much load a case sends, and its bound.
    With `zero_skips`, --requests 0 is allowed and skips that part of the benchmark."""
    skip = "" if zero_skips is None else f"; 0 skips {zero_skips}"
    parser.add_argument(
        "--requests",
        type=positive_int if zero_skips is None else count,
        default=requests,
        help=f"measured {noun} per case ({requests}){skip}",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=warmup,
        help=f"warm-up {noun} per case, not measured ({warmup})",
    )
    parser.add_argument(
        "--time-cap", type=float, default=60.0, help="hard time cap per case in seconds (60)"
    )


def add_concurrency_argument(
    parser: argparse.ArgumentParser, of: str = "", default: Sequence[int] = (1, 16)
) -> None:
    """--concurrency: the levels each path is measured at."""
    levels = " ".join(str(level) for level in default)
    parser.add_argument(
        "--concurrency",
        type=positive_int,
        nargs="+",
        default=list(default),
        help=f"concurrency levels{of} ({levels})",
    )


def add_gateway_arguments(parser: argparse.ArgumentParser) -> None:
    """--database-url and --workers, the same in every benchmark."""
    parser.add_argument(
        "--database-url",
        help="run on PostgreSQL: URL of the server's admin database on 127.0.0.1 "
        f"('postgresql' = {DEFAULT_PG_ADMIN_URL}); a fresh database is created and dropped. "
        "Default: SQLite in a temporary data dir",
    )
    parser.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        help="server processes behind Envoy (`gateway up --workers N`; 1)",
    )


def add_json_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write results as JSON")
