"""The operator CLI, run as operators run it: the installed `gateway` command."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import httpx

from testkit.processes import GatewayProcess

GATEWAY = shutil.which("gateway")


def run(
    data_dir: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    assert GATEWAY is not None, "the package installs the `gateway` command"
    environment = {k: v for k, v in os.environ.items() if k != "GATEWAY_DATABASE_URL"}
    environment.update(env or {})
    return subprocess.run(
        [GATEWAY, *args, "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
    )


def test_operator_workflow_on_the_embedded_default(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert run(data, "workspaces", "create", "acme", "--intern-programme").returncode == 0
    intern = run(data, "interns", "create", "--workspace", "acme", "helper")
    assert intern.returncode == 0 and intern.stdout.strip().splitlines()[-1].startswith("intern_")
    created = run(
        data,
        "keys",
        "create",
        "--name",
        "ci",
        "--workspace",
        "acme",
        "--limit",
        "7.5",
        "--limit-reset",
        "weekly",
    )
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip().splitlines()[-1]
    assert key.startswith("sk-gw-v1-") and len(key) == len("sk-gw-v1-") + 64
    manager = run(data, "keys", "create", "--name", "ops", "--management")
    assert manager.returncode == 0
    assert run(data, "credits", "add", "--amount", "9", "--workspace", "acme").returncode == 0
    updated = run(
        data,
        "workspaces",
        "update",
        "acme",
        "--vault-writes",
        "off",
        "--default-callback-url",
        "https://hooks.example.com/v",
    )
    assert updated.returncode == 0 and "vault writes off" in updated.stdout
    listing = run(data, "keys", "list", "--workspace", "acme")
    assert "ci" in listing.stdout and key not in listing.stdout  # never the key itself
    assert key not in (data / "gateway.db").read_bytes().decode("latin-1")

    gateway = GatewayProcess(
        data_dir=data, database_url=f"sqlite+aiosqlite:///{data / 'gateway.db'}"
    )
    gateway.start()
    try:
        response = httpx.get(f"{gateway.base_url}/key", headers={"Authorization": f"Bearer {key}"})
        assert response.status_code == 200
        body = response.json()["data"]
        assert body["limit"] == 7.5 and body["limit_reset"] == "weekly"
        assert body["free_model_daily_requests"]["limit"] == 1000
        assert body["is_free_tier"] is False
        key_hash = listing.stdout.split()[0]
        disabled = run(data, "keys", "update", key_hash, "--disabled")
        assert disabled.returncode == 0
        again = httpx.get(f"{gateway.base_url}/key", headers={"Authorization": f"Bearer {key}"})
        assert again.status_code == 401
    finally:
        assert gateway.stop() == 0  # SIGTERM: a clean shutdown
    assert "Gateway stopped." in gateway.log()


# The CLI's refusals (bad arguments, bad edge settings, a duplicate workspace) are checked
# in-process: tests/unit/test_cli_arguments.py.


def test_database_url_reaches_postgresql(tmp_path: Path, pg_database: str) -> None:
    plain = pg_database.replace("postgresql+asyncpg://", "postgresql://")
    created = run(
        tmp_path / "unused", "keys", "create", "--name", "pg", env={"GATEWAY_DATABASE_URL": plain}
    )
    assert created.returncode == 0, created.stderr
    listing = run(tmp_path / "unused", "keys", "list", "--database-url", plain)
    assert "pg" in listing.stdout
    assert not (tmp_path / "unused" / "gateway.db").exists()


def test_vault_master_key_rotation(tmp_path: Path) -> None:
    data = tmp_path / "data"
    run(data, "workspaces", "create", "vaulted", "--intern-programme")
    key = run(data, "keys", "create", "--name", "v", "--workspace", "vaulted").stdout.split()[-1]
    gateway = GatewayProcess(
        data_dir=data, database_url=f"sqlite+aiosqlite:///{data / 'gateway.db'}"
    )
    gateway.start()
    headers = {"Authorization": f"Bearer {key}"}
    try:
        stored = httpx.put(
            f"{gateway.base_url}/vault/secrets/token",
            headers=headers,
            json={"value": "v1", "hosts": ["a.example.com"]},
        )
        assert stored.status_code == 200
    finally:
        gateway.stop()
    old_key = (data / "vault-master.key").read_text()
    rotated = run(data, "vault", "rotate-master-key")
    assert rotated.returncode == 0 and "Re-wrapped 1 vault keys" in rotated.stdout
    assert (data / "vault-master.key").read_text() != old_key
    assert oct((data / "vault-master.key").stat().st_mode)[-3:] == "600"
    gateway = GatewayProcess(
        data_dir=data, database_url=f"sqlite+aiosqlite:///{data / 'gateway.db'}"
    )
    gateway.start()
    try:  # the secret still opens under the new key: copying decrypts and re-seals it
        interns = run(data, "interns", "create", "--workspace", "vaulted", "bot")
        intern_id = interns.stdout.split()[-1]
        copied = httpx.post(
            f"{gateway.base_url}/vault/interns/{intern_id}/secrets/copy",
            headers=headers,
            json={"names": ["token"]},
        )
        assert copied.status_code == 200, copied.text
    finally:
        gateway.stop()


# Keys with an expiry and guardrails with a budget are created and listed in-process:
# tests/unit/test_cli_commands.py.


def test_the_operator_key_is_issued_once_into_a_private_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = run(data, "migrate")
    assert first.returncode == 0, first.stderr
    path = data / "operator-key"
    key = path.read_text().strip()
    assert key.startswith("sk-gw-op-") and len(key) == len("sk-gw-op-") + 64
    assert oct(path.stat().st_mode)[-3:] == "600"
    assert f"written to {path}" in first.stdout and key not in first.stdout + first.stderr
    stored = (data / "gateway.db").read_bytes().decode("latin-1")
    assert key not in stored and hashlib.sha256(key.encode()).hexdigest() in stored
    again = run(data, "migrate")  # present: kept, only its path printed
    assert path.read_text().strip() == key and str(path) in again.stdout
    rotated = run(data, "operator-key", "rotate")
    assert rotated.returncode == 0 and key not in rotated.stdout
    new = path.read_text().strip()
    assert new != key and new not in rotated.stdout
    assert oct(path.stat().st_mode)[-3:] == "600"
