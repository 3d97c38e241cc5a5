"""The operator CLI's refusals, in-process: `server.cli.main` with the arguments an operator
types, its exit status and the one line on stderr (never a traceback). The installed
`gateway` command itself, run as operators run it, is tests/test_cli.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import exit_status

pytestmark = pytest.mark.usefixtures("as_an_operator")


def _run(capsys: pytest.CaptureFixture[str], data_dir: Path, *args: str) -> tuple[int, str]:
    code = exit_status([*args, "--data-dir", str(data_dir)])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("keys", "create", "--name", "x", "--limit", "abc"), "decimal number of USD"),
        (("keys", "create", "--name", "x", "--limit-reset", "yearly"), "invalid choice"),
        (
            ("keys", "create", "--name", "x", "--limit-reset", "daily"),
            "--limit-reset needs --limit",
        ),
        (("keys", "create", "--name", "x", "--workspace", "nope"), "no workspace named 'nope'"),
        (("credits", "add", "--amount", "0"), "greater than 0"),
        (("credits", "add", "--amount", "-3"), "no sign"),
        (("workspaces", "create", "bad name!"), "workspace name must be"),
        (("interns", "create", "--workspace", "nope", "x"), "no workspace named"),
        (("keys", "update", "0" * 64, "--disabled"), "no API key with hash"),
        (("up", "--http-port", "70000"), "port must be 1-65535"),
        (("workspaces", "update", "default", "--vault-writes", "maybe"), "expected on or off"),
    ],
)
def test_bad_arguments_get_clear_messages(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    code, stderr = _run(capsys, tmp_path / "data", *args)
    assert code != 0
    assert message in stderr
    assert "Traceback" not in stderr


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("GATEWAY_CORS_ORIGINS", 'https://app.example.com, evil"', "is not an origin"),
        ("GATEWAY_EDGE_CLIENT_RPS", "lots", "GATEWAY_EDGE_CLIENT_RPS must be a number"),
        ("GATEWAY_EDGE_HEADERS_TIMEOUT_SECONDS", "0", "must be greater than 0"),
    ],
)
def test_bad_edge_settings_are_refused(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    variable: str,
    value: str,
    message: str,
) -> None:
    monkeypatch.setenv(variable, value)
    code, stderr = _run(capsys, tmp_path / "data", "up")
    assert code == 2
    assert message in stderr and "Traceback" not in stderr


def test_duplicate_workspace_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert _run(capsys, data, "workspaces", "create", "twice")[0] == 0
    code, stderr = _run(capsys, data, "workspaces", "create", "twice")
    assert code != 0 and "already exists" in stderr
