"""The gateway with its limit checks taken out, for bench.limits to measure what they cost.

`python -m bench.unlimited up` is `gateway up` (the same stack code: migrations, Envoy in
front, `--workers N` server processes) whose servers admit every request with NoLimits
instead of the enforced limits (server/limits/admission.py): no free-model gate, no credit
hold, no database access at admission. Settlement is unchanged: it deletes the (absent) hold
and records the charge. This lives in bench/ on purpose: no operator switch of the gateway
turns limits off.

    python -m bench.unlimited up --data-dir DIR --http-port 8080 --grpc-port 50051 [--workers N]
    python -m bench.unlimited serve --data-dir DIR --grpc-port 50051   # one server process

The database URL and the catalog come from the environment (GATEWAY_DATABASE_URL,
GATEWAY_CATALOG) or --database-url/--catalog, as for `gateway`. Beyond the gateway's own
modules it imports only the ready line of testkit/processes.py (standard library), so
the processes' memory stays comparable with the gateway's.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlmodel.ext.asyncio.session import AsyncSession

from facade.stack import run_stack, serve_command
from server.app import serve
from server.auth import Principal
from server.billing.holds import DEFAULT_HOLD_TTL, Hold
from server.cli import stop_on_signals, write_port_file
from server.config import load_settings
from server.limits.guardrail_budgets import GuardrailBudget
from server.observability.logs import configure_logging_from_environment
from testkit.processes import READY_LINE


class NoLimits:
    """Admits every request without touching the database. The hold has no id, so settling
    it deletes nothing and still records the charge."""

    async def admit(
        self,
        session: AsyncSession,
        principal: Principal,
        *,
        model_id: str,
        estimate_micros: int,
        now: datetime,
        ttl: timedelta = DEFAULT_HOLD_TTL,
        is_byok: bool = False,
        budgets: Sequence[GuardrailBudget] = (),
    ) -> Hold:
        return Hold("", principal.account.id, principal.key.hash, estimate_micros, is_byok)


# The server processes of `up --workers N`: `python -m bench.unlimited serve`.
unlimited_serve_command = functools.partial(
    serve_command, entry_point=("-m", "bench.unlimited", "serve")
)


async def up(args: argparse.Namespace) -> None:
    settings = load_settings(
        args.data_dir,
        args.database_url,
        catalog_file=args.catalog,
        grpc_port=args.grpc_port,
        rest_port=args.rest_port,
        http_port=args.http_port,
        metrics_port=args.metrics_port,
    )
    stop = stop_on_signals()

    def announce(base_url: str, grpc_targets: list[str]) -> None:
        targets = ", ".join(grpc_targets)
        print(f"{READY_LINE} (no limits): REST {base_url}  gRPC {targets}", flush=True)

    await run_stack(
        settings,
        stop,
        announce,
        args.workers,
        limits=NoLimits(),
        worker_command=unlimited_serve_command,
    )


async def serve_alone(args: argparse.Namespace) -> None:
    settings = load_settings(
        args.data_dir,
        args.database_url,
        catalog_file=args.catalog,
        grpc_port=args.grpc_port,
        rest_port=args.rest_port,
        metrics_port=args.metrics_port,
    )
    port_file = args.port_file
    await serve(
        settings,
        stop=stop_on_signals(),
        limits=NoLimits(),
        listening=None if port_file is None else lambda port: write_port_file(port_file, port),
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.unlimited",
        description="The gateway without limit checks (for bench.limits only).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name, run in (("up", up), ("serve", serve_alone)):
        command = commands.add_parser(name)
        command.add_argument("--data-dir", required=True)
        command.add_argument("--database-url")
        command.add_argument("--catalog")
        command.add_argument("--grpc-port", type=int, required=True)
        # The REST listener's port (`gateway serve --rest-port`; 0: a free one), as
        # facade.stack's serve_command passes it to every server process.
        command.add_argument("--rest-port", type=int, default=0)
        command.add_argument("--metrics-port", type=int, default=0)
        if name == "serve":
            command.add_argument("--port-file")
        if name == "up":
            command.add_argument("--http-port", type=int, required=True)
            command.add_argument("--workers", type=int, default=1)
        command.set_defaults(run=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging_from_environment()
    asyncio.run(args.run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
