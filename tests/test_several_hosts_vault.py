"""Several hosts on one database (issue 30, items 3 and 4): two `gateway up`, each with a
data dir of its own, on one PostgreSQL database (what two hosts look like) share the vault
when they share GATEWAY_VAULT_MASTER_KEY; a gateway with another master key (its own key
file, or another GATEWAY_VAULT_MASTER_KEY) exits non-zero before serving anything, with one
line naming GATEWAY_VAULT_MASTER_KEY and the key file it used. The embedded default (one
gateway, its key file) keeps working, and the database holds the key's check value only."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import sqlalchemy as sa

from server.db.engine import create_engine, session_factory
from server.vault.crypto import MasterKey
from testkit.admin import Admin, IssuedKey
from testkit.processes import READY_LINE, GatewayProcess

SECRET = "several-hosts-Distinctive-VALUE-4d2a"
HOSTS = ["api.example.com"]
# A refused start is quick (no Envoy, no workers): a bound on how long it may take.
REFUSED_WITHIN = 60.0


@dataclass
class Hosts:
    a: GatewayProcess
    b: GatewayProcess
    database_url: str
    admin: Admin
    key: str  # the master key both share, base64


@pytest_asyncio.fixture
async def hosts(pg_database: str, tmp_path: Path) -> AsyncIterator[Hosts]:
    key = MasterKey.generate_base64()
    env = {"GATEWAY_VAULT_MASTER_KEY": key}
    a = GatewayProcess(data_dir=tmp_path / "a", database_url=pg_database, extra_env=env)
    b = GatewayProcess(data_dir=tmp_path / "b", database_url=pg_database, extra_env=env)
    engine = create_engine(pg_database)
    try:
        a.start()  # A first: its check value is the database's before B starts
        b.start()
        yield Hosts(a, b, pg_database, Admin(session_factory(engine)), key)
    finally:
        await engine.dispose()
        await asyncio.gather(asyncio.to_thread(a.stop), asyncio.to_thread(b.stop))


async def call(
    client: httpx.AsyncClient, gateway: GatewayProcess, issued: IssuedKey, path: str, body: Any
) -> httpx.Response:
    return await client.request(
        "PUT" if body is not None and "/copy" not in path else "POST",
        f"{gateway.base_url}/vault{path}",
        json=body,
        headers=issued.headers,
    )


def refused_start(gateway: GatewayProcess) -> str:
    """Start `gateway`, which must exit non-zero before serving; its one line."""
    with pytest.raises(RuntimeError, match="gateway did not start"):
        gateway.start(ready_within=REFUSED_WITHIN, draws=1)
    assert gateway.process is not None and gateway.process.returncode not in (None, 0)
    log = gateway.log()
    assert READY_LINE not in log
    assert not (gateway.data_dir / "envoy").exists()  # Envoy never started
    lines = [line for line in log.splitlines() if "GATEWAY_VAULT_MASTER_KEY" in line]
    assert len(lines) == 1, log
    assert "Traceback" not in log, log
    return lines[0]


async def test_a_secret_written_on_one_host_is_used_on_the_other_and_another_key_is_refused(
    hosts: Hosts, tmp_path: Path
) -> None:
    workspace = await hosts.admin.workspace("several-hosts", intern_programme=True)
    intern = await hosts.admin.intern(workspace, "helper")
    issued = await hosts.admin.key(workspace, "vault")
    async with httpx.AsyncClient(timeout=60) as client:
        first = await call(
            client, hosts.a, issued, "/secrets/api_token", {"value": SECRET, "hosts": HOSTS}
        )
        assert first.status_code == 200, first.text
        # Through B: the same vault's data key (its value's fingerprint), a second write, and
        # the secret itself opened and sealed again into the intern's vault.
        second = await call(
            client, hosts.b, issued, "/secrets/same_value", {"value": SECRET, "hosts": HOSTS}
        )
        assert second.status_code == 200, second.text
        assert second.json()["data"]["fingerprint"] == first.json()["data"]["fingerprint"]
        copied = await call(
            client,
            hosts.b,
            issued,
            f"/interns/{intern.id}/secrets/copy",
            {"names": ["api_token"]},
        )
        assert copied.status_code == 200, copied.text
        assert [s["name"] for s in copied.json()["data"]] == ["api_token"]
        again = await call(
            client,
            hosts.a,
            issued,
            f"/interns/{intern.id}/secrets/own",
            {"value": "intern-own", "hosts": HOSTS},
        )
        assert again.status_code == 200, again.text

    # A third host with a key file of its own (no GATEWAY_VAULT_MASTER_KEY): refused.
    c = GatewayProcess(data_dir=tmp_path / "c", database_url=hosts.database_url)
    line = refused_start(c)
    key_file = (tmp_path / "c" / "vault-master.key").absolute()
    assert str(key_file) in line
    assert key_file.read_text().strip() not in line
    # Another GATEWAY_VAULT_MASTER_KEY, with --workers 2: refused before any worker starts.
    other = MasterKey.generate_base64()
    d = GatewayProcess(
        data_dir=tmp_path / "d",
        database_url=hosts.database_url,
        extra_env={"GATEWAY_VAULT_MASTER_KEY": other},
        extra_args=("--workers", "2"),
    )
    line = refused_start(d)
    assert "from GATEWAY_VAULT_MASTER_KEY" in line
    assert other not in line and hosts.key not in line
    assert not (tmp_path / "d" / "ports" / "grpc-0").exists()


async def test_the_embedded_default_keeps_working_with_its_key_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GATEWAY_VAULT_MASTER_KEY", raising=False)
    data = tmp_path / "data"
    url = f"sqlite+aiosqlite:///{data / 'gateway.db'}"
    engine = create_engine(url)
    try:
        for round_ in range(2):  # a restart finds its own check value
            gateway = GatewayProcess(data_dir=data, database_url=url)
            gateway.start()
            try:
                admin = Admin(session_factory(engine))
                workspace = await admin.workspace(f"embedded-{round_}", intern_programme=True)
                issued = await admin.key(workspace, "vault")
                async with httpx.AsyncClient(timeout=60) as client:
                    put = await call(
                        client, gateway, issued, "/secrets/token", {"value": SECRET, "hosts": HOSTS}
                    )
                assert put.status_code == 200, put.text
            finally:
                assert gateway.stop() == 0
        key = base64.b64decode((data / "vault-master.key").read_text())
        async with session_factory(engine)() as session:
            rows = (await session.exec(sa.text("SELECT name, value FROM agreements"))).all()  # type: ignore[call-overload]
        assert [(name, value) for name, value in rows] == [
            ("vault-master-key", MasterKey(key).check_value())
        ]
        assert key.hex() not in rows[0][1]
    finally:
        await engine.dispose()
