"""Where finished videos are kept: files under the content folder, one per job and index.
Several server processes on one host share the folder (compose: a shared volume)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

CHUNK = 256 * 1024


class ContentStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, job_id: str, index: int) -> Path:
        if not job_id.replace("_", "").isalnum():
            raise ValueError("bad job id")
        return self.root / job_id / f"{index}.mp4"

    def save(self, job_id: str, index: int, data: bytes) -> None:
        """Written whole to a temporary file, then renamed: a reader never sees half a video."""
        path = self._path(job_id, index)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, scratch = tempfile.mkstemp(dir=path.parent, prefix=".partial-")
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(scratch, path)

    def exists(self, job_id: str, index: int) -> bool:
        return self._path(job_id, index).is_file()

    def size(self, job_id: str, index: int) -> int:
        return self._path(job_id, index).stat().st_size

    def chunks(self, job_id: str, index: int) -> Iterator[bytes]:
        with open(self._path(job_id, index), "rb") as handle:
            while chunk := handle.read(CHUNK):
                yield chunk

    def delete(self, job_id: str) -> None:
        shutil.rmtree(self.root / job_id, ignore_errors=True)
