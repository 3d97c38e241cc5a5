"""BYOK end to end: a workspace's own provider key through the official `openrouter` SDK's
`byok` calls (masked in every answer), the CLI's listing, a transcription the fake provider
serves only with that key (is_byok, the platform fee from credits, GET /key's byok_usage), and
the key's removal. One gateway of the module's own: no operator credential for the provider,
no free BYOK requests, a 10% fee."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from openrouter import OpenRouter, errors

from server.db.engine import create_engine, session_factory
from testkit.admin import Admin, IssuedKey
from testkit.audio import b64, fixture
from testkit.catalog import fake_endpoint
from testkit.fakes.openai_stt import FakeSttProvider
from testkit.processes import GatewayProcess

OWN_KEY = "sk-own-provider-account-0123456789wxyz"
PRICE_PER_SECOND = Decimal("0.01")
FEE_PERCENT = Decimal(10)
GATEWAY = shutil.which("gateway")


@dataclass
class ByokGateway:
    gateway: GatewayProcess
    provider: FakeSttProvider
    manager: IssuedKey  # a management key
    member: IssuedKey  # an ordinary key of the same workspace
    data_dir: Path


@pytest.fixture(scope="module")
def own_account_provider() -> Iterator[FakeSttProvider]:
    """The provider as the workspace's own account sees it: only OWN_KEY is accepted."""
    provider = FakeSttProvider(api_keys=(OWN_KEY,)).start()
    yield provider
    provider.stop()


@pytest_asyncio.fixture(scope="module")
async def byok_gateway(
    tmp_path_factory: pytest.TempPathFactory, own_account_provider: FakeSttProvider
) -> AsyncIterator[ByokGateway]:
    folder = tmp_path_factory.mktemp("byok")
    catalog = folder / "catalog.toml"
    endpoint = fake_endpoint(
        own_account_provider.base_url, "ok", provider="openai", key_env="BYOK_TEST_UNSET_KEY"
    )
    catalog.write_text(
        "[[models]]\n"
        'id = "byok/whisper"\n'
        'kind = "stt"\n'
        f'price_per_second = "{PRICE_PER_SECOND}"\n'
        "[[models.endpoints]]\n"
        f"{endpoint}\n"
    )
    data_dir = folder / "gw"
    url = f"sqlite+aiosqlite:///{data_dir / 'gateway.db'}"
    gateway = GatewayProcess(
        data_dir=data_dir,
        database_url=url,
        extra_env={
            "GATEWAY_CATALOG": str(catalog),
            "GATEWAY_BYOK_FEE_PERCENT": str(FEE_PERCENT),
            "GATEWAY_BYOK_FREE_REQUESTS_PER_MONTH": "0",
        },
    )
    await asyncio.to_thread(gateway.start)
    engine = create_engine(url)
    try:
        admin = Admin(session_factory(engine))
        workspace = await admin.workspace("byok")
        await admin.credits(workspace, "10")
        yield ByokGateway(
            gateway,
            own_account_provider,
            await admin.key(workspace, "manager", management=True),
            await admin.key(workspace, "member"),
            data_dir,
        )
    finally:
        await engine.dispose()
        await asyncio.to_thread(gateway.stop)


def _transcribe(stack: ByokGateway) -> httpx.Response:
    body = {"model": "byok/whisper", "input_audio": {"data": b64(fixture()), "format": "wav"}}
    return httpx.post(
        f"{stack.gateway.base_url}/audio/transcriptions",
        json=body,
        headers=stack.member.headers,
        timeout=60,
    )


def test_a_workspace_key_serves_its_requests_and_pays_the_platform_fee(
    byok_gateway: ByokGateway,
) -> None:
    stack = byok_gateway
    # Without the workspace's key, the provider has no credential: nothing is usable.
    assert _transcribe(stack).status_code == 503

    with OpenRouter(api_key=stack.manager.key, server_url=stack.gateway.base_url) as client:
        created = client.byok.create(provider="openai", key=OWN_KEY, name="our account")
        assert created.data.label == "...wxyz" and created.data.provider == "openai"
        assert (created.data.is_fallback, created.data.sort_order) == (False, 0)
        listed = client.byok.list()
        assert listed is not None
        assert [(k.id, k.label) for k in listed.result.data] == [(created.data.id, "...wxyz")]
        assert OWN_KEY not in listed.result.model_dump_json()
        assert client.byok.get(id=created.data.id).data.name == "our account"
        updated = client.byok.update(id=created.data.id, is_required=True)
        assert updated.data.is_required is True

    with OpenRouter(api_key=stack.member.key, server_url=stack.gateway.base_url) as member:
        with pytest.raises(errors.ForbiddenResponseError):
            member.byok.list()
    refused = httpx.post(
        f"{stack.gateway.base_url}/byok",
        json={"provider": "not-in-the-catalog", "key": OWN_KEY},
        headers=stack.manager.headers,
    )
    assert refused.status_code == 400 and refused.json()["error"]["metadata"]["param"] == "provider"
    assert OWN_KEY not in refused.text

    assert GATEWAY is not None
    shown = subprocess.run(
        [GATEWAY, "byok", "list", "--workspace", "byok", "--data-dir", str(stack.data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"GATEWAY_DATABASE_URL": stack.gateway.database_url, "PATH": sys.exec_prefix + "/bin"},
    )
    assert created.data.id in shown.stdout and "...wxyz" in shown.stdout, shown.stderr
    assert OWN_KEY not in shown.stdout

    answer = _transcribe(stack)
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    provider_cost = PRICE_PER_SECOND * Decimal(str(usage["seconds"]))
    fee = (provider_cost * FEE_PERCENT / 100).quantize(Decimal("0.000001"))
    assert usage["is_byok"] is True
    assert Decimal(str(usage["cost"])) == fee > 0
    assert stack.provider.calls[-1].authorization == f"Bearer {OWN_KEY}"

    with OpenRouter(api_key=stack.member.key, server_url=stack.gateway.base_url) as member:
        status = member.api_keys.get_current_key_metadata().data
    assert Decimal(str(status.byok_usage)) == provider_cost.quantize(Decimal("0.000001"))
    assert status.byok_usage_daily == status.byok_usage
    assert Decimal(str(status.usage)) == fee  # only the fee comes from the credits

    with OpenRouter(api_key=stack.manager.key, server_url=stack.gateway.base_url) as client:
        assert client.byok.delete(id=created.data.id).DELETED is True
        remaining = client.byok.list()
        assert remaining is not None and remaining.result.data == []
    assert _transcribe(stack).status_code == 503
    log = stack.gateway.log()
    assert not [OWN_KEY[i : i + 12] for i in range(len(OWN_KEY) - 11) if OWN_KEY[i : i + 12] in log]


def _python_path() -> dict[str, str]:
    """The code under test (a worktree on PYTHONPATH), not only the installed one."""
    given = os.environ.get("PYTHONPATH")
    return {} if given is None else {"PYTHONPATH": given}


def test_the_cli_creates_lists_and_deletes_keys_read_from_stdin_or_a_variable(
    tmp_path: Path,
) -> None:
    assert GATEWAY is not None
    data = tmp_path / "data"

    def gateway(*args: str, stdin: str = "", env: dict[str, str] | None = None) -> str:
        done = subprocess.run(
            [GATEWAY, "byok", *args, "--data-dir", str(data)],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": sys.exec_prefix + "/bin", **_python_path(), **(env or {})},
        )
        assert done.returncode == 0, done.stderr
        assert OWN_KEY not in done.stdout + done.stderr
        return done.stdout

    first = gateway("create", "--provider", "openai", "--name", "ours", stdin=OWN_KEY + "\n")
    second = gateway(
        "create", "--provider", "openai", "--key-env", "OWN", "--fallback", env={"OWN": OWN_KEY}
    )
    first_id, second_id = first.split()[-1], second.split()[-1]
    assert "...wxyz" in first and first_id != second_id
    assert f"Deleted BYOK key ...wxyz for openai ({first_id})" in gateway("delete", first_id)
    (listed,) = gateway("list").splitlines()
    assert listed.split()[:4] == [second_id, "openai", "1", "...wxyz"]
    assert listed.endswith("fallback")
    assert OWN_KEY.encode() not in (data / "gateway.db").read_bytes()
