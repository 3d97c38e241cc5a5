"""bench.unlimited (the gateway without limit checks, bench.limits' other side) starts its
server processes with facade.stack's command line: every flag that command passes must be
one its `serve` takes (a flag added to `gateway serve` once made `--workers 2` exit 2)."""

from __future__ import annotations

from pathlib import Path

from bench.unlimited import build_parser, unlimited_serve_command
from server.config import load_settings


def test_every_flag_of_the_worker_command_is_taken(tmp_path: Path) -> None:
    settings = load_settings(tmp_path, None, catalog_file="catalog.json", metrics_port=9100)
    command = unlimited_serve_command(settings, 1)
    entry = command.index("serve")
    args = build_parser().parse_args([*command[entry:], "--port-file", str(tmp_path / "p")])
    assert args.command == "serve"
    assert args.data_dir == str(settings.data_dir)
    assert args.rest_port == int(command[command.index("--rest-port") + 1])
    assert args.grpc_port == int(command[command.index("--grpc-port") + 1])
