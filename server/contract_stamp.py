"""The fingerprint of the .proto files the generated contract was built from.

Shared by the build hook (setup.py, which loads this file by path) and by server.contract,
which compares it with the checkout's proto/ when there is one. Standard library only.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

STAMP_NAME = "STAMP"


def proto_files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.proto"))


def fingerprint(root: Path) -> str:
    """SHA-256 over every .proto file under `root`: its relative path and its bytes."""
    digest = hashlib.sha256()
    for path in proto_files(root):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()
