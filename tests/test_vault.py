"""The vault through Envoy and the official SDK: routes, scope rules, validation edges,
encryption at rest, no leaks, and concurrent writes; plus release and rotation."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from cryptography.exceptions import InvalidTag
from openrouter import OpenRouter

from server.accounts.workspaces import update_workspace, workspace_by_id
from server.db.models import Intern, VaultKey, VaultSecret, Workspace
from server.db.stamp import CHECK_INTERVAL as PRINCIPAL_CHECK_INTERVAL
from server.vault import crypto, store
from testkit.admin import Admin, IssuedKey
from tests.conftest import Stack

SECRET = "s3cr3t-Distinctive-VALUE-7f1c2e"


class Vault:
    def __init__(self, stack: Stack, issued: IssuedKey, intern: Intern) -> None:
        self.stack, self.issued, self.intern = stack, issued, intern
        self.responses: list[str] = []

    async def call(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> httpx.Response:
        async with httpx.AsyncClient() as client:
            response = await client.request(
                method,
                f"{self.stack.base_url}/vault{path}",
                json=body,
                headers={**self.issued.headers, **(headers or {})},
            )
        self.responses.append(response.text + str(response.headers))
        return response


@pytest.fixture
async def vault(stack: Stack, unique: str) -> Vault:
    workspace = await stack.admin.workspace(f"vault-{unique}", intern_programme=True)
    intern = await stack.admin.intern(workspace, "helper")
    return Vault(stack, await stack.admin.key(workspace, "vault"), intern)


async def test_sdk_round_trip(vault: Vault) -> None:
    stack, intern = vault.stack, vault.intern

    def flow() -> dict[str, Any]:
        with OpenRouter(api_key=vault.issued.key, server_url=stack.base_url) as sdk:
            stored = sdk.vault.store_vault_secret(
                name="github_token", value=SECRET, hosts=["API.github.com.", "api.github.com"]
            )
            sdk.vault.store_vault_secret(name="slack_token", value="other", hosts=["slack.com"])
            listed = sdk.vault.list_vault_secrets(limit=1)
            copied = sdk.vault.copy_vault_secrets_to_intern(
                intern_id=intern.id, names=["github_token"]
            )
            own = sdk.vault.store_intern_vault_secret(
                intern_id=intern.id, name="slack_token", value="intern-own", hosts=["slack.com"]
            )
            effective = sdk.vault.list_intern_effective_vault_secrets(intern_id=intern.id)
            intern_list = sdk.vault.list_intern_vault_secrets(intern_id=intern.id)
            sdk.vault.delete_intern_vault_secret(intern_id=intern.id, name="slack_token")
            sdk.vault.delete_vault_secret(name="slack_token")
            after = sdk.vault.list_vault_secrets()
            return locals()

    r = await asyncio.to_thread(flow)
    assert r["stored"].data.name == "github_token" and r["stored"].data.hosts == ["api.github.com"]
    assert len(r["listed"].data) == 1 and r["listed"].has_more is True
    assert r["copied"].data[0].name == "github_token"
    # Different vaults, different fingerprints for the same value.
    assert r["copied"].data[0].fingerprint != r["stored"].data.fingerprint
    assert {(s.name, s.scope) for s in r["effective"].data} == {
        ("github_token", "intern"),
        ("slack_token", "intern"),
    }
    assert [s.name for s in r["intern_list"].data] == ["github_token", "slack_token"]
    assert [s.name for s in r["after"].data] == ["github_token"]


async def test_fingerprints_match_within_a_vault(vault: Vault) -> None:
    a = await vault.call("PUT", "/secrets/a_one", {"value": "same", "hosts": ["a.example.com"]})
    b = await vault.call("PUT", "/secrets/b_two", {"value": "same", "hosts": ["a.example.com"]})
    c = await vault.call("PUT", "/secrets/c_three", {"value": "diff", "hosts": ["a.example.com"]})
    assert a.json()["data"]["fingerprint"] == b.json()["data"]["fingerprint"]
    assert a.json()["data"]["fingerprint"] != c.json()["data"]["fingerprint"]


async def test_scopes_never_fall_back(vault: Vault) -> None:
    intern = vault.intern.id
    await vault.call("PUT", "/secrets/shared_name", {"value": "ws", "hosts": ["x.example.com"]})
    await vault.call(
        "PUT", f"/interns/{intern}/secrets/shared_name", {"value": "in", "hosts": ["x.example.com"]}
    )
    deleted = await vault.call("DELETE", f"/interns/{intern}/secrets/shared_name")
    assert deleted.status_code == 204 and deleted.content == b""
    again = await vault.call("DELETE", f"/interns/{intern}/secrets/shared_name")
    assert again.status_code == 404  # the workspace secret of that name is untouched
    assert [s["name"] for s in (await vault.call("GET", "/secrets")).json()["data"]] == [
        "shared_name"
    ]
    effective = (await vault.call("GET", f"/interns/{intern}/effective-secrets")).json()
    assert [(s["name"], s["scope"]) for s in effective["data"]] == [("shared_name", "workspace")]
    assert (await vault.call("DELETE", "/secrets/shared_name")).status_code == 204


async def test_other_workspaces_interns_and_intern_keys(vault: Vault, unique: str) -> None:
    stack = vault.stack
    other_ws = await stack.admin.workspace(f"vault-other-{unique}", intern_programme=True)
    other_intern = await stack.admin.intern(other_ws, "theirs")
    for path in (
        f"/interns/{other_intern.id}/secrets",
        "/interns/intern_nope/secrets",
        f"/interns/{other_intern.id}/effective-secrets",
    ):
        assert (await vault.call("GET", path)).status_code == 404
    intern_key = await stack.admin.key(vault.issued.workspace, "bot", intern_id=vault.intern.id)
    as_intern = Vault(stack, intern_key, vault.intern)
    assert (await as_intern.call("GET", "/secrets")).status_code == 404
    assert (await as_intern.call("GET", f"/interns/{vault.intern.id}/secrets")).status_code == 200
    second = await stack.admin.intern(vault.issued.workspace, "second")
    assert (await as_intern.call("GET", f"/interns/{second.id}/secrets")).status_code == 404


async def test_outside_the_programme_everything_is_404(stack: Stack, unique: str) -> None:
    workspace = await stack.admin.workspace(f"noprog-{unique}")
    intern = await stack.admin.intern(workspace, "i")
    outsider = Vault(stack, await stack.admin.key(workspace), intern)
    for method, path, body in (
        ("GET", "/secrets", None),
        ("PUT", "/secrets/a", {"value": "v", "hosts": ["a.com"]}),
        ("DELETE", "/secrets/a", None),
        ("GET", f"/interns/{intern.id}/effective-secrets", None),
        ("POST", f"/interns/{intern.id}/secrets/copy", {"names": ["a"]}),
    ):
        response = await outsider.call(method, path, body)
        assert response.status_code == 404, (method, path)
        assert response.json()["error"]["code"] == 404


async def test_regional_hosts_403_and_disabled_writes_503(vault: Vault) -> None:
    refused = await vault.call("GET", "/secrets", headers={"Host": "eu.localhost"})
    assert refused.status_code == 403
    spoofed = await vault.call("GET", "/secrets", headers={"x-gateway-authority": "eu.localhost"})
    assert spoofed.status_code == 200  # the header is Envoy's to set, not the client's
    await vault.call("PUT", "/secrets/keep_me", {"value": "v", "hosts": ["a.example.com"]})
    async with vault.stack.admin.sessions() as session:
        workspace = await workspace_by_id(session, vault.issued.workspace.id)
        assert workspace is not None
        await update_workspace(session, workspace, vault_writes_disabled=True)
        await session.commit()
    # Changed outside the server (as the CLI does): seen within the principal cache's second.
    await asyncio.sleep(PRINCIPAL_CHECK_INTERVAL.total_seconds())
    intern = vault.intern.id
    for method, path, body in (
        ("PUT", "/secrets/new_one", {"value": "v", "hosts": ["a.example.com"]}),
        ("DELETE", "/secrets/keep_me", None),
        ("PUT", f"/interns/{intern}/secrets/x", {"value": "v", "hosts": ["a.example.com"]}),
        ("POST", f"/interns/{intern}/secrets/copy", {"names": ["keep_me"]}),
    ):
        response = await vault.call(method, path, body)
        assert response.status_code == 503, (method, path, response.text)
    names = [s["name"] for s in (await vault.call("GET", "/secrets")).json()["data"]]
    assert names == ["keep_me"]  # reads still work; nothing changed


@pytest.mark.parametrize(
    "host", ["eu.localhost.", "EU.LOCALHOST", "Eu.Localhost.:8080", "eu.gateway.test.:443"]
)
async def test_regional_hosts_are_compared_as_dns_names(vault: Vault, host: str) -> None:
    """A trailing dot (the DNS root), capitals or a port name the same regional host."""
    refused = await vault.call("GET", "/secrets", headers={"Host": host})
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["code"] == 403
    written = await vault.call(
        "PUT", "/secrets/regional", {"value": "v", "hosts": ["a.example.com"]}, {"Host": host}
    )
    assert written.status_code == 403, written.text
    assert (await vault.call("GET", "/secrets")).json()["data"] == []


def test_secret_hosts_and_release_compare_dns_names() -> None:
    assert store.check_hosts(["B\u00fccher.Example.", "xn--bcher-kva.example"]) == [
        "xn--bcher-kva.example"
    ]
    assert store.normalize_host("API.Example.com.") == "api.example.com"


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("a", True),
        ("a_b", True),
        ("a1", True),
        ("abc_def_9", True),
        ("a" * 255, True),
        ("a__b", False),
        ("_a", False),
        ("a_", False),
        ("A", False),
        ("1a", False),
        ("a" * 256, False),
        ("a-b", False),
        ("\u0430", False),
        ("a\u017f", False),
        ("a%0A", False),
    ],
)
async def test_name_rule_edges(vault: Vault, name: str, ok: bool) -> None:
    response = await vault.call(
        "PUT", f"/secrets/{name}", {"value": "v", "hosts": ["a.example.com"]}
    )
    assert (response.status_code == 200) is ok, response.text
    if not ok:
        assert response.json()["error"]["metadata"] == {"param": "name"}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"value": "", "hosts": ["a.com"]}, "value"),
        ({"value": "x" * 65537, "hosts": ["a.com"]}, "value"),
        ({"value": "v", "hosts": []}, "hosts"),
        ({"value": "v", "hosts": [f"h{i}.example.com" for i in range(101)]}, "hosts"),
        ({"value": "v", "hosts": ["https://a.com"]}, "hosts"),
        ({"value": "v", "hosts": ["a.com:443"]}, "hosts"),
        ({"value": "v", "hosts": ["a.com/path"]}, "hosts"),
        ({"value": "v", "hosts": ["*.a.com"]}, "hosts"),
        ({"value": "v", "hosts": ["10.0.0.1"]}, "hosts"),
        ({"value": "v", "hosts": [""]}, "hosts"),
        ({"value": "v", "hosts": ["exa mple.com"]}, "hosts"),
    ],
)
async def test_value_and_host_rules(vault: Vault, body: dict[str, Any], param: str) -> None:
    response = await vault.call("PUT", "/secrets/rule_check", body)
    assert response.status_code == 400
    assert response.json()["error"]["metadata"] == {"param": param}
    assert (await vault.call("GET", "/secrets")).json()["data"] == []


async def test_copy_rules(vault: Vault) -> None:
    intern = vault.intern.id
    await vault.call("PUT", "/secrets/exists", {"value": "v", "hosts": ["a.example.com"]})
    cases = [
        ({"names": []}, 400),
        ({"names": ["exists", "exists"]}, 400),
        ({"names": [f"n{i}" for i in range(101)]}, 400),
        ({"names": ["exists", "missing"]}, 404),
    ]
    for body, status in cases:
        assert (
            await vault.call("POST", f"/interns/{intern}/secrets/copy", body)
        ).status_code == status
    assert (await vault.call("GET", f"/interns/{intern}/secrets")).json()["data"] == []


async def test_the_value_never_leaks(vault: Vault) -> None:
    intern = vault.intern.id
    await vault.call("PUT", "/secrets/leak_check", {"value": SECRET, "hosts": ["a.example.com"]})
    await vault.call("PUT", "/secrets/Bad__Name", {"value": SECRET, "hosts": ["a.example.com"]})
    await vault.call("PUT", "/secrets/bad_hosts", {"value": SECRET, "hosts": ["*.x"]})
    await vault.call("POST", f"/interns/{intern}/secrets/copy", {"names": ["leak_check"]})
    await vault.call("GET", "/secrets")
    await vault.call("GET", f"/interns/{intern}/effective-secrets")
    await vault.call(
        "PUT",
        f"/interns/{intern}/secrets/leak_check",
        {"value": SECRET, "hosts": ["a.example.com"]},
    )
    await vault.call("DELETE", "/secrets/leak_check")
    await vault.call("DELETE", "/secrets/leak_check")
    assert not any(SECRET in text for text in vault.responses)
    assert SECRET not in vault.stack.gateway.log()
    async with vault.stack.admin.sessions() as session:
        rows = (await session.exec(sa.select(VaultSecret))).all()
    assert rows and not any(SECRET.encode() in bytes(r[0].ciphertext) for r in rows)
    assert not any(SECRET in str(r[0].hosts) + r[0].fingerprint for r in rows)


@pytest.mark.both_backends  # concurrent upserts: each database's locking is the point
async def test_concurrent_writes_leave_one_whole_row(vault: Vault) -> None:
    values = [f"value-{i}" for i in range(12)]
    results = await asyncio.gather(
        *(
            vault.call("PUT", "/secrets/contended", {"value": v, "hosts": [f"h{i}.example.com"]})
            for i, v in enumerate(values)
        ),
        *(vault.call("DELETE", "/secrets/contended") for _ in range(4)),
    )
    assert all(r.status_code in (200, 204, 404) for r in results)
    async with vault.stack.admin.sessions() as session:
        rows = [
            r[0]
            for r in (
                await session.exec(
                    sa.select(VaultSecret).where(
                        VaultSecret.workspace_id == vault.issued.workspace.id,
                        VaultSecret.name == "contended",
                    )
                )
            ).all()
        ]
        assert len(rows) <= 1
        if rows:  # a whole row: its value opens and matches its fingerprint and hosts
            key_row = await session.get(VaultKey, f"ws:{vault.issued.workspace.id}")
    if rows:
        assert key_row is not None
        master = crypto.load_master_key(vault.stack.gateway.data_dir)
        data_key = master.unwrap(key_row.wrapped_key)
        value = crypto.open_sealed(
            data_key,
            rows[0].workspace_id,
            "workspace",
            "contended",
            rows[0].ciphertext,
            rows[0].nonce,
        )
        assert value in values
        assert crypto.fingerprint(data_key, value) == rows[0].fingerprint
        assert rows[0].hosts == [f"h{values.index(value)}.example.com"]


# --- domain: release, sealing, rotation ------------------------------------------------------


@pytest.fixture
async def seeded(
    admin_db: Admin, tmp_path: Any
) -> tuple[Admin, crypto.MasterKey, Workspace, Intern]:
    workspace = await admin_db.workspace("release", intern_programme=True)
    intern = await admin_db.intern(workspace, "bot")
    master = crypto.MasterKey(b"\x01" * 32)
    now = datetime.now(UTC)
    async with admin_db.sessions() as session:
        await store.put_secret(
            session,
            master,
            store.Scope(workspace, None),
            "api_token",
            SECRET,
            ["api.example.com"],
            now,
        )
        await session.commit()
    return admin_db, master, workspace, intern


@pytest.mark.parametrize(
    ("host", "released"),
    [
        ("api.example.com", True),
        ("API.Example.com.", True),
        ("example.com", False),
        ("api.example.com.evil.net", False),
        ("evil.api.example.com", False),
        ("api.example.com:443", False),
        ("", False),
    ],
)
async def test_release_only_to_an_exact_host(seeded: Any, host: str, released: bool) -> None:
    admin, master, workspace, intern = seeded
    async with admin.sessions() as session:
        if released:
            assert (
                await store.release(
                    session, master, workspace, intern, "api_token", host, datetime.now(UTC)
                )
                == SECRET
            )
        else:
            with pytest.raises(store.HostNotAllowed):
                await store.release(
                    session, master, workspace, intern, "api_token", host, datetime.now(UTC)
                )


async def test_a_moved_ciphertext_does_not_open(seeded: Any) -> None:
    admin, master, workspace, _ = seeded
    async with admin.sessions() as session:
        (secret,) = (await session.exec(sa.select(VaultSecret))).one()
        key_row = await session.get(VaultKey, f"ws:{workspace.id}")
    data_key = master.unwrap(key_row.wrapped_key)
    with pytest.raises(InvalidTag):  # same vault key, another name: the AAD differs
        crypto.open_sealed(
            data_key, workspace.id, "workspace", "other_name", secret.ciphertext, secret.nonce
        )


async def test_master_key_rotation_rewraps_without_touching_ciphertexts(seeded: Any) -> None:
    admin, master, workspace, intern = seeded
    new_master = crypto.MasterKey(b"\x02" * 32)
    async with admin.sessions() as session:
        before = [
            (r[0].id, bytes(r[0].ciphertext))
            for r in (await session.exec(sa.select(VaultSecret))).all()
        ]
        assert await store.rotate_master_key(session, master, new_master) == 1
        await session.commit()
    async with admin.sessions() as session:
        after = [
            (r[0].id, bytes(r[0].ciphertext))
            for r in (await session.exec(sa.select(VaultSecret))).all()
        ]
        assert after == before
        value = await store.release(
            session,
            new_master,
            workspace,
            intern,
            "api_token",
            "api.example.com",
            datetime.now(UTC),
        )
    assert value == SECRET
