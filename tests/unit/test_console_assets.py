"""The console's file table (server/console): only the package's files, by their relative
path, each with its type, caching and security headers; anything else is a 404."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.console import CONTENT_SECURITY_POLICY, ConsoleAssets
from server.errors import GatewayError


def test_the_table_holds_the_files_and_nothing_outside_them(tmp_path: Path) -> None:
    root = tmp_path / "static"
    (root / "vendor").mkdir(parents=True)
    (root / "index.html").write_text("<!doctype html>")
    (root / "vendor" / "lib-1.0.0.js").write_text("export default 1;")
    (root / "notes.md").write_text("not served: no known type")
    (tmp_path / "secret.txt").write_text("outside the root")
    assets = ConsoleAssets(root)
    assert sorted(assets.paths()) == ["index.html", "vendor/lib-1.0.0.js"]
    page = assets.get("index.html")
    assert page.content_type == "text/html; charset=utf-8" and page.cache_control == "no-cache"
    library = assets.get("vendor/lib-1.0.0.js?v=1")
    assert library.content_type.startswith("text/javascript")
    assert "immutable" in library.cache_control
    headers = dict(library.headers())
    assert headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert headers["x-content-type-options"] == "nosniff"
    for wanted in ("../secret.txt", "/etc/passwd", "vendor/../index.html", "notes.md", ""):
        with pytest.raises(GatewayError) as missing:
            assets.get(wanted)
        assert missing.value.status == 404


def test_the_shipped_console_has_no_inline_script_or_style() -> None:
    assets = ConsoleAssets()
    assert {"index.html", "app.js", "app.css"} <= set(assets.paths())
    page = assets.get("index.html").data.decode()
    assert "<style" not in page and " style=" not in page
    assert all(
        "src=" in line for line in page.splitlines() if "<script" in line
    )  # every script is a file
    for policy in ("'unsafe-inline'", "'unsafe-eval'", "http:", "https:"):
        assert policy not in CONTENT_SECURITY_POLICY
