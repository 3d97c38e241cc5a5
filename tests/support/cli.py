"""The `gateway` command run in-process by the unit tests, as an operator runs it (the
`as_an_operator` fixture of tests/unit/conftest.py sets the scene)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from server.cli import main


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def exit_status(args: list[str]) -> int:
    """`gateway ARGS` in this process: its exit status (argparse refuses with 2)."""
    try:
        return main(args)
    except SystemExit as exit:
        return int(exit.code or 0)


async def gateway(capsys: pytest.CaptureFixture[str], *args: str) -> Ran:
    """`gateway ARGS` in-process from a test's event loop (main runs its own: in a thread),
    with what it printed."""
    code = await asyncio.to_thread(exit_status, list(args))
    out, err = capsys.readouterr()
    return Ran(code, out, err)
