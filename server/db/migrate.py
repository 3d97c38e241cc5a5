"""Alembic migrations, run from code: the server and the CLI call `upgrade`.

A database already at HEAD_REVISION (every start but the first after an upgrade of the
gateway) is recognised with one query, and nothing more is done. Otherwise the migrations
run in a child process (`python -m server.db.migrate REVISION`, the database URL passed in
the environment, never on a command line): alembic, and what a migration run allocates,
never enter a server process's memory, whose peak RSS issue 17 bounds (the bound and the
measured peak are on the documentation's performance page). `upgrade_sync` runs them in
the calling process (tests, the child itself).
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from server.db.engine import create_engine

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
# The newest migration's revision (migrations/versions/): a test checks it is alembic's head.
HEAD_REVISION = "0018_ledger_indexes"
# The child's database URL: in its environment, as a password must not be in `ps` output.
DATABASE_URL_ENV = "GATEWAY_MIGRATE_DATABASE_URL"
# How much of a failed child's exception line its error repeats.
_ERROR_TAIL_CHARS = 2000
_EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*: ")


class MigrationFailed(RuntimeError):
    """The migrations' child process failed; the message ends with what it said."""


def alembic_config(database_url: str) -> Config:
    from alembic.config import Config  # only where migrations run: see the module docstring

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    # ConfigParser interpolation would choke on '%' in passwords.
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def upgrade_sync(database_url: str, revision: str = "head") -> None:
    """Run the migrations in this process (env.py drives its own event loop: not on one)."""
    from alembic import command

    command.upgrade(alembic_config(database_url), revision)


async def current_revision(database_url: str) -> str | None:
    """The database's alembic revision; None when it has none (a new database). A database
    that cannot be reached raises here, in the caller's process, as any first query would."""
    engine = create_engine(database_url)
    try:
        async with engine.connect() as connection:
            try:
                row = (
                    await connection.execute(sa.text("SELECT version_num FROM alembic_version"))
                ).first()
            except DBAPIError:  # no alembic_version table yet
                return None
            return None if row is None else str(row[0])
    finally:
        await engine.dispose()


async def upgrade(database_url: str, revision: str = "head") -> None:
    """Bring the database to `revision`: nothing when it is at HEAD_REVISION already, else
    the migrations in a child process (see the module docstring)."""
    if (
        revision in ("head", HEAD_REVISION)
        and await current_revision(database_url) == HEAD_REVISION
    ):
        return
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "server.db.migrate",
        revision,
        env={**os.environ, DATABASE_URL_ENV: database_url},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await process.communicate()
    if process.returncode != 0:
        said = stderr.decode("utf-8", "replace").strip()
        reason = _reason(said, process.returncode)[:_ERROR_TAIL_CHARS]
        raise MigrationFailed(f"the database migrations failed: {reason}")


def _reason(said: str, returncode: int | None) -> str:
    """The exception's line of a failed child's stderr (`module.Error: message`): a database
    error ends with SQLAlchemy's statement and a link line after it."""
    lines = said.splitlines()
    raised = [line for line in lines if _EXCEPTION_LINE.match(line)]
    if raised:
        return raised[-1]
    return lines[-1] if lines else f"exit status {returncode}"


def main(argv: list[str]) -> int:
    revision = argv[0] if argv else "head"
    upgrade_sync(os.environ[DATABASE_URL_ENV], revision)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
