"""Operator commands in-process (`server.cli.main` with the arguments an operator types, on
a copy of the migrated database): what they print, what they refuse in one clear line, and
the money bounds they enforce. Moved here from the end-to-end files, where each command was
a `gateway` subprocess; the installed command itself is still run as operators run it in
tests/test_cli.py."""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.cli import Ran, exit_status

pytestmark = pytest.mark.usefixtures("as_an_operator")


@pytest.fixture
def data(tmp_path: Path, migrated_sqlite: Path) -> Path:
    """A data directory whose embedded database is already migrated."""
    folder = tmp_path / "data"
    folder.mkdir()
    shutil.copyfile(migrated_sqlite, folder / "gateway.db")
    return folder


Run = Callable[..., Ran]  # the `gateway` command's arguments -> what it did


@pytest.fixture
def gateway(capsys: pytest.CaptureFixture[str], data: Path) -> Run:
    def run(*args: str) -> Ran:
        code = exit_status([*args, "--data-dir", str(data)])
        out, err = capsys.readouterr()
        return Ran(code, out, err)

    return run


def _one_clear_line(result: Ran, *needles: str) -> str:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    last = result.stderr.strip().splitlines()[-1]
    for needle in needles:
        assert needle in last, result.stderr
    return last


# --- money bounds (from tests/test_money_bounds.py) ------------------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("credits", "add", "--amount", "1e309"), "decimal number of USD"),
        (("credits", "add", "--amount", "1" + "0" * 18), "at most 1000000000 USD"),
        (("credits", "add", "--amount", "0.0000015"), "whole number of micro-dollars"),
        (("credits", "add", "--amount", "NaN"), "decimal number of USD"),
        (("keys", "create", "--name", "k", "--limit", "1" + "0" * 18), "at most 1000000000 USD"),
        (("keys", "create", "--name", "k", "--limit", "0.0000001"), "micro-dollars"),
        (("guardrails", "create", "--name", "g", "--max-cost-per-request", "1" + "0" * 18), "1e9"),
        (
            ("guardrails", "create", "--name", "g", "--max-video-duration", str(10**18)),
            "max_video_duration_seconds must be 1 to 86400",
        ),
    ],
)
def test_cli_refuses_amounts_it_cannot_store_exactly(
    gateway: Run, args: tuple[str, ...], needle: str
) -> None:
    _one_clear_line(gateway(*args), "error", needle)


def test_cli_adds_exact_amounts_and_bounds_the_balance(gateway: Run) -> None:
    tiny = gateway("credits", "add", "--amount", "0.000001")
    assert tiny.returncode == 0, tiny.stderr
    assert "Added 0.000001 USD" in tiny.stdout
    big = gateway("credits", "add", "--amount", "1000000000")
    _one_clear_line(big, "beyond 1000000000 USD")  # 1e9 + 1 µ$ would pass the bound
    most = gateway("credits", "add", "--amount", "999999999.999999")
    assert most.returncode == 0, most.stderr
    assert "Added 999999999.999999 USD" in most.stdout


def test_cli_names_a_missing_database_in_one_line(gateway: Run) -> None:
    name = f"nope_{secrets.token_hex(4)}"
    url = f"postgresql://postgres:pw-{name}@127.0.0.1:5432/{name}"
    result = gateway("keys", "list", "--database-url", url)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"gateway: error: cannot connect to the database "
        f'postgresql://postgres:***@127.0.0.1:5432/{name}: database "{name}" does not exist'
    )
    assert f"pw-{name}" not in result.stderr + result.stdout


# --- keys and guardrails (from tests/test_cli.py and tests/test_guardrails.py) ------------------


def test_keys_create_with_an_expiry_lists_it(gateway: Run) -> None:
    created = gateway("keys", "create", "--name", "temp", "--expires-at", "2099-01-02T03:04:05Z")
    assert created.returncode == 0, created.stderr
    listed = gateway("keys", "list")
    assert "temp  expires 2099-01-02T03:04:05.000Z" in listed.stdout
    vague = gateway("keys", "create", "--name", "x", "--expires-at", "2099-01-02")
    past = gateway("keys", "create", "--name", "y", "--expires-at", "2001-01-01T00:00:00Z")
    assert vague.returncode != 0 and "--expires-at must be an ISO 8601" in vague.stderr
    assert past.returncode != 0 and "expires_at must be in the future" in past.stderr


def test_guardrails_create_with_a_budget(gateway: Run) -> None:
    budget = ("--limit-usd", "2.5", "--reset-interval", "weekly")
    created = gateway("guardrails", "create", "--name", "weekly", *budget)
    assert created.returncode == 0, created.stderr
    listed = gateway("guardrails", "list")
    assert "limit_usd=2.5 reset_interval=weekly" in listed.stdout
    half = gateway("guardrails", "create", "--name", "half", "--limit-usd", "1")
    assert half.returncode != 0 and "must be given together" in half.stderr


def test_cli_guardrails(gateway: Run) -> None:
    models = "local/pocketsphinx-en,local/renderer"
    created = gateway(
        "guardrails",
        "create",
        "--name",
        "ops",
        "--allowed-models",
        models,
        "--max-cost-per-request",
        "0.25",
        "--max-video-duration",
        "4",
    )
    assert created.returncode == 0, created.stderr
    guardrail_id = created.stdout.split()[-1]
    listed = gateway("guardrails", "list")
    assert guardrail_id in listed.stdout and "max_cost_per_request_usd=0.25" in listed.stdout
    assert "allowed_models=['local/pocketsphinx-en', 'local/renderer']" in listed.stdout
    unknown = gateway("guardrails", "create", "--name", "x", "--allowed-models", "nope/x")
    assert unknown.returncode == 2 and "unknown model" in unknown.stderr
    assert gateway("guardrails", "delete", guardrail_id).returncode == 0
    assert guardrail_id not in gateway("guardrails", "list").stdout


def test_cli_disables_and_enables_a_workspace(gateway: Run) -> None:
    """`gateway workspaces update NAME --disabled on|off`: the operator's switch, as PATCH
    /workspaces/{id} {disabled} (every key of the workspace refused while on)."""
    assert gateway("workspaces", "create", "switched").returncode == 0
    off = gateway("workspaces", "update", "switched", "--disabled", "on")
    assert off.returncode == 0, off.stderr
    assert "switched: disabled (its keys are refused)" in off.stdout
    on = gateway("workspaces", "update", "switched", "--disabled", "off")
    assert on.returncode == 0, on.stderr
    assert "switched: enabled" in on.stdout
