"""`gateway --version` says which release is running: the installed distribution's version,
which is pyproject.toml's, and CHANGELOG.md says what that release changed."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest

from server.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_gateway_version_prints_the_installed_release(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    expected = importlib.metadata.version("inference-gateway")
    assert capsys.readouterr().out.strip() == f"gateway {expected}"


def test_the_changelog_describes_the_version_in_pyproject() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    changelog = (ROOT / "CHANGELOG.md").read_text()
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", changelog, re.M)
    assert released, "CHANGELOG.md has no '## [x.y.z] - YYYY-MM-DD' release heading"
    assert released[0][0] == version, "the newest release in CHANGELOG.md is pyproject's"
    assert "## [Unreleased]" in changelog.split(f"## [{version}]")[0]
