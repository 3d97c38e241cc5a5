"""The web console's static files, shipped in the package (server/console/static) and served
by GET /console/{path} (server/services/console.py): a fixed table of the files found at
start, so a path is either one of them or a 404 — `..`, absolute paths and anything the
package does not hold never reach the file system."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from server.errors import not_found

STATIC_DIR = Path(__file__).resolve().parent / "static"
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".txt": "text/plain; charset=utf-8",
}
# Scripts and styles only from the console itself: no inline code, no eval, no CDN. Videos
# play from blob: URLs (fetched with the key, which a <video src> could not send).
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "media-src 'self' blob:; connect-src 'self'; font-src 'self'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)
# Vendored files carry their version in their name and never change: cache them for a year.
# The console's own files may change with any release: revalidate them.
IMMUTABLE = "public, max-age=31536000, immutable"
REVALIDATE = "no-cache"


@dataclass(frozen=True)
class Asset:
    path: str
    content_type: str
    data: bytes

    @property
    def cache_control(self) -> str:
        return IMMUTABLE if self.path.startswith("vendor/") else REVALIDATE

    def headers(self) -> tuple[tuple[str, str], ...]:
        return (
            ("cache-control", self.cache_control),
            ("content-security-policy", CONTENT_SECURITY_POLICY),
            ("x-content-type-options", "nosniff"),
            ("referrer-policy", "no-referrer"),
            ("x-frame-options", "DENY"),
        )


class ConsoleAssets:
    """The files under `root`, read once, by their path relative to it."""

    def __init__(self, root: Path = STATIC_DIR) -> None:
        self._assets: dict[str, Asset] = {}
        for file in sorted(root.rglob("*")):
            content_type = CONTENT_TYPES.get(file.suffix)
            if file.is_file() and content_type is not None:
                path = file.relative_to(root).as_posix()
                self._assets[path] = Asset(path, content_type, file.read_bytes())

    def paths(self) -> list[str]:
        return list(self._assets)

    def get(self, path: str) -> Asset:
        asset = self._assets.get(path.split("?", 1)[0])
        if asset is None:
            raise not_found("No such console page or file")
        return asset
