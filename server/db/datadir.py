"""The data dir: private to the operator's user, and bound to one database.

It holds the embedded SQLite database, the operator key, the vault master key and what
Envoy and the server write, so it is created 0700 and the secrets in it 0600 whatever the
umask. A data dir found with looser modes is tightened (and a warning says what changed):
the gateway owns it.

It also remembers which database it belongs to (`DATA_DIR/database`, written once the
database was reached: the URL without password, or `sqlite:gateway.db` for the embedded
default). A command given the data dir with another database is refused, naming both and
the flag, instead of creating a new SQLite database beside the real one and writing keys
into the data dir that the running gateway does not know."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from pathlib import Path

from sqlalchemy.engine import make_url

log = logging.getLogger("gateway.datadir")

DIR_MODE = 0o700
FILE_MODE = 0o600
DATABASE_RECORD = "database"
EMBEDDED_DATABASE = "gateway.db"
# Files of the data dir that hold secrets or the database: tightened when found looser.
PRIVATE_FILES = (
    EMBEDDED_DATABASE,
    f"{EMBEDDED_DATABASE}-wal",
    f"{EMBEDDED_DATABASE}-shm",
    "operator-key",
    "vault-master.key",
    DATABASE_RECORD,
)
# Written by the gateway into a data dir before the record existed: such a dir without a
# record and without gateway.db was used with a database elsewhere.
_USED_MARKERS = ("operator-key", "vault-master.key")


class DataDirMismatch(RuntimeError):
    """The data dir belongs to another database than the one this command was given."""


def _tighten(path: Path, mode: int) -> None:
    """Clear the group and other bits of `path` (a file or dir of ours), saying so."""
    with contextlib.suppress(FileNotFoundError):
        current = stat.S_IMODE(path.stat().st_mode)
        if current & ~mode:
            os.chmod(path, current & mode)
            log.warning(
                "%s was mode %s: tightened to %s (readable by its owner only)",
                path,
                oct(current),
                oct(current & mode),
            )


def private_dir(path: Path) -> Path:
    """`path` (and missing parents) created 0700 whatever the umask; an existing one
    tightened to 0700."""
    if not path.is_dir():
        path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        os.chmod(path, DIR_MODE)  # mkdir's mode is masked by the umask
    _tighten(path, DIR_MODE)
    return path


def private_file(path: Path) -> Path:
    """`path` created empty with mode 0600 when missing (before anything else opens it:
    SQLite gives its -wal and -shm files the mode of the database file); an existing one
    tightened to 0600. The parent dir must exist."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        _tighten(path, FILE_MODE)
    else:
        os.fchmod(descriptor, FILE_MODE)  # os.open's mode is masked by the umask
        os.close(descriptor)
    return path


def tighten_data_dir(data_dir: Path) -> None:
    """The data dir 0700 and its secrets 0600 (created here when missing)."""
    private_dir(data_dir)
    for name in PRIVATE_FILES:
        _tighten(data_dir / name, FILE_MODE)


def database_identity(database_url: str, data_dir: Path) -> str:
    """What the data dir remembers of its database: never a password. The embedded default
    (SQLite in the data dir) is `sqlite:gateway.db`, so a data dir can be moved; another
    SQLite file its absolute path; a server database `backend://user@host:port/name`."""
    url = make_url(database_url)
    backend = url.get_backend_name()
    if backend == "sqlite":
        database = Path(url.database or ":memory:")
        if database.name == ":memory:":
            return "sqlite::memory:"
        with contextlib.suppress(OSError, ValueError):
            if database.resolve().parent == data_dir.resolve():
                return f"sqlite:{database.name}"
        return f"sqlite:///{database.resolve()}"
    host = url.host or str(url.query.get("host") or "localhost")
    port = url.port or (5432 if backend == "postgresql" else "")
    user = f"{url.username}@" if url.username else ""
    return f"{backend}://{user}{host}{f':{port}' if port else ''}/{url.database or ''}"


def recorded_database(data_dir: Path) -> str | None:
    try:
        text = (data_dir / DATABASE_RECORD).read_text()
    except FileNotFoundError:
        return None
    lines = [line.strip() for line in text.splitlines() if line.strip() and line[0] != "#"]
    return lines[0] if lines else None


def check_database(data_dir: Path, database_url: str) -> None:
    """Refuse (DataDirMismatch) when the data dir belongs to another database than
    `database_url`; nothing is created or written here."""
    given = database_identity(database_url, data_dir)
    recorded = recorded_database(data_dir)
    if recorded is not None:
        if recorded != given:
            raise DataDirMismatch(
                f"the data dir {data_dir} belongs to the database {recorded} "
                f"(recorded in {data_dir / DATABASE_RECORD}), not {given}: pass "
                "--database-url (or GATEWAY_DATABASE_URL) for that database, "
                "or another --data-dir"
            )
        return
    # A data dir from before the record: keys issued into it but no embedded database
    # means it belongs to a database elsewhere, which the default cannot be.
    embedded = f"sqlite:{EMBEDDED_DATABASE}"
    used = any((data_dir / name).exists() for name in _USED_MARKERS)
    if given == embedded and used and not (data_dir / EMBEDDED_DATABASE).exists():
        raise DataDirMismatch(
            f"the data dir {data_dir} holds keys but no {EMBEDDED_DATABASE}: it belongs to "
            "another database; pass --database-url (or GATEWAY_DATABASE_URL) for it, "
            "or another --data-dir"
        )


def remember_database(data_dir: Path, database_url: str) -> None:
    """Record the database of an existing data dir, once (after the database was
    reached: a mistyped URL is never remembered)."""
    if not data_dir.is_dir() or recorded_database(data_dir) is not None:
        return
    record = data_dir / DATABASE_RECORD
    partial = data_dir / f".{DATABASE_RECORD}.{os.getpid()}"
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    os.fchmod(descriptor, FILE_MODE)
    with os.fdopen(descriptor, "w") as file:
        file.write(
            "# The database this data dir belongs to (never a password). Commands given\n"
            "# this data dir with another database are refused.\n"
            f"{database_identity(database_url, data_dir)}\n"
        )
    with contextlib.suppress(FileExistsError):
        # A link, not a rename: two first starts at once, the first record stays.
        os.link(partial, record)
    partial.unlink()
