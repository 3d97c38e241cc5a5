"""/api/v1/keys and /api/v1/credits with the official `openrouter` SDK, unchanged."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import httpx
import hypothesis
from hypothesis import strategies as st
from openrouter import OpenRouter

from tests.conftest import Stack
from tests.support.fuzz import (
    Findings,
    SuccessShape,
    answer_problems,
    fuzz_settings,
    raw_request,
    server_errors_since,
)
from tests.test_fuzz_fields import body_with, raw_values


async def test_sdk_key_lifecycle(stack: Stack, unique: str) -> None:
    workspace = await stack.admin.workspace(f"mgmt-{unique}")
    manager = await stack.admin.key(workspace, "manager", management=True)
    expires = (datetime.now(UTC) + timedelta(days=3)).replace(microsecond=0)

    async with OpenRouter(api_key=manager.key, server_url=stack.base_url) as sdk:
        created = await sdk.api_keys.create_async(
            name="worker",
            limit=12.5,
            limit_reset="weekly",
            include_byok_in_limit=True,
            expires_at=expires,
        )
        assert created.key.startswith("sk-gw-v1-")
        data = created.data
        assert data.name == "worker" and data.limit == 12.5 and data.limit_reset == "weekly"
        assert data.limit_remaining == 12.5 and data.include_byok_in_limit is True
        assert data.expires_at == expires and data.disabled is False
        assert data.workspace_id == workspace.id

        # The new key works on its own.
        async with httpx.AsyncClient() as client:
            own = await client.get(
                f"{stack.base_url}/key", headers={"Authorization": f"Bearer {created.key}"}
            )
        assert own.status_code == 200 and own.json()["data"]["limit"] == 12.5

        listed = await sdk.api_keys.list_async()
        assert {k.hash for k in listed.data} == {manager.hash, data.hash}
        fetched = await sdk.api_keys.get_async(hash=data.hash)
        assert fetched.data.label == data.label

        updated = await sdk.api_keys.update_async(
            hash=data.hash, name="renamed", disabled=True, limit=None
        )
        assert updated.data.name == "renamed" and updated.data.disabled is True
        assert updated.data.limit is None and updated.data.limit_remaining is None
        assert updated.data.updated_at is not None
        assert (await sdk.api_keys.list_async()).data.__len__() == 1  # disabled: hidden
        assert len((await sdk.api_keys.list_async(include_disabled=True)).data) == 2
        async with httpx.AsyncClient() as client:
            disabled = await client.get(
                f"{stack.base_url}/key", headers={"Authorization": f"Bearer {created.key}"}
            )
        assert disabled.status_code == 401

        deleted = await sdk.api_keys.delete_async(hash=data.hash)
        assert deleted.DELETED is True  # the SDK names the constant member so
    async with httpx.AsyncClient() as client:
        gone = await client.get(f"{stack.base_url}/keys/{data.hash}", headers=manager.headers)
    assert gone.status_code == 404
    assert gone.json()["error"]["code"] == 404


async def test_sdk_credits(stack: Stack, unique: str) -> None:
    workspace = await stack.admin.workspace(f"credits-{unique}")
    manager = await stack.admin.key(workspace, "manager", management=True)
    await stack.admin.credits(workspace, "20")
    await stack.admin.credits(workspace, "5.25")
    await stack.admin.charge(manager, "3.125")
    await stack.admin.charge(manager, "1", is_byok=True)  # paid to the provider directly
    async with OpenRouter(api_key=manager.key, server_url=stack.base_url) as sdk:
        credits = await sdk.credits.get_credits_async()
    assert credits.data.total_credits == 25.25
    assert credits.data.total_usage == 3.125


async def test_keys_of_other_accounts_are_invisible(stack: Stack, unique: str) -> None:
    mine = await stack.admin.workspace(f"mine-{unique}")
    theirs = await stack.admin.workspace(f"theirs-{unique}")
    manager = await stack.admin.key(mine, "manager", management=True)
    other = await stack.admin.key(theirs, "other")
    async with httpx.AsyncClient() as client:
        for method in ("GET", "DELETE"):
            response = await client.request(
                method, f"{stack.base_url}/keys/{other.hash}", headers=manager.headers
            )
            assert response.status_code == 404
        patched = await client.patch(
            f"{stack.base_url}/keys/{other.hash}",
            json={"disabled": True},
            headers=manager.headers,
        )
        assert patched.status_code == 404
        cross = await client.post(
            f"{stack.base_url}/keys",
            json={"name": "x", "workspace_id": theirs.id},
            headers=manager.headers,
        )
        assert cross.status_code == 404
        listing = await client.get(
            f"{stack.base_url}/keys", params={"workspace_id": theirs.id}, headers=manager.headers
        )
        assert listing.status_code == 404
    # Untouched.
    async with httpx.AsyncClient() as client:
        assert (await client.get(f"{stack.base_url}/key", headers=other.headers)).status_code == 200


def _operator(stack: Stack) -> dict[str, str]:
    """The operator key `gateway up` wrote to its data dir (mode 0600)."""
    path = stack.gateway.data_dir / "operator-key"
    assert oct(path.stat().st_mode)[-3:] == "600"
    key = path.read_text().strip()
    assert key.startswith("sk-gw-op-")
    assert key not in stack.gateway.log()  # only the file's path is printed
    return {"Authorization": f"Bearer {key}"}


async def test_the_operator_runs_the_quickstart_over_rest(stack: Stack, unique: str) -> None:
    operator = _operator(stack)
    name = f"op-{unique}"
    async with httpx.AsyncClient(base_url=stack.base_url) as client:
        created = await client.post(
            "/workspaces", json={"name": name, "intern_programme": True}, headers=operator
        )
        assert created.status_code == 201, created.text
        workspace = created.json()["data"]
        assert workspace["name"] == name and workspace["intern_programme"] is True
        assert workspace["total_credits"] == 0 and workspace["default_callback_url"] is None
        duplicate = await client.post("/workspaces", json={"name": name}, headers=operator)
        bad_name = await client.post("/workspaces", json={"name": "no spaces"}, headers=operator)
        listed = (await client.get("/workspaces?limit=100", headers=operator)).json()
        path = f"/workspaces/{workspace['id']}"
        patched = await client.patch(path, json={"intern_programme": False}, headers=operator)

        credits = await client.post(f"{path}/credits", json={"amount": 12.5}, headers=operator)
        exact = await client.post(f"{path}/credits", json={"amount": "0.000001"}, headers=operator)
        refusals = [
            await client.post(f"{path}/credits", json={"amount": amount}, headers=operator)
            for amount in (0, -1, 0.0000015, 1e9 + 1, "ten", None)
        ]
        # Total purchases stay within 1e9 USD.
        beyond = await client.post(f"{path}/credits", json={"amount": 1e9}, headers=operator)
        unknown = await client.post(
            "/workspaces/ws_nothing/credits", json={"amount": 1}, headers=operator
        )

        issued = await client.post(f"{path}/keys", json={"name": "first admin"}, headers=operator)
        assert issued.status_code == 201, issued.text
        manager = issued.json()
        assert manager["key"].startswith("sk-gw-v1-")
        assert manager["data"]["is_management_key"] is True
        assert manager["data"]["workspace_id"] == workspace["id"]
        headers = {"Authorization": f"Bearer {manager['key']}"}
        # The management key takes over: a standard key, the credits it sees.
        standard = await client.post("/keys", json={"name": "app"}, headers=headers)
        balance = (await client.get("/credits", headers=headers)).json()["data"]
    assert duplicate.status_code == 409 and bad_name.status_code == 400
    assert bad_name.json()["error"]["metadata"]["param"] == "name"
    assert name in [w["name"] for w in listed["data"]] and listed["total_count"] >= 1
    assert patched.status_code == 200 and patched.json()["data"]["intern_programme"] is False
    assert credits.status_code == 201, credits.text
    assert credits.json()["purchase"]["amount"] == 12.5
    assert credits.json()["data"]["total_credits"] == 12.5
    assert exact.status_code == 201 and exact.json()["data"]["total_credits"] == 12.500001
    for refused in refusals:
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["metadata"]["param"] == "amount"
    assert "greater than 0" in refusals[0].json()["error"]["message"]
    assert "micro-dollars" in refusals[2].json()["error"]["message"]
    assert beyond.status_code == 400 and "1e9" in beyond.json()["error"]["message"]
    assert unknown.status_code == 404
    assert standard.status_code == 201 and standard.json()["data"]["is_management_key"] is False
    assert balance["total_credits"] == 12.500001


async def test_only_the_operator_key_may_call_the_operator_routes(
    stack: Stack, unique: str
) -> None:
    workspace = await stack.admin.workspace(f"not-op-{unique}")
    manager = await stack.admin.key(workspace, "manager", management=True)
    standard = await stack.admin.key(workspace, "standard")
    wrong_operator = {"Authorization": "Bearer sk-gw-op-" + "0" * 64}
    calls = [
        ("GET", "/workspaces", None),
        ("POST", "/workspaces", {"name": f"sneaky-{unique}"}),
        ("PATCH", f"/workspaces/{workspace.id}", {"intern_programme": True}),
        ("POST", f"/workspaces/{workspace.id}/keys", {"name": "x"}),
        ("POST", f"/workspaces/{workspace.id}/credits", {"amount": 5}),
    ]
    async with httpx.AsyncClient(base_url=stack.base_url) as client:
        for method, path, body in calls:
            for headers, status in (
                (manager.headers, 403),
                (standard.headers, 403),
                (wrong_operator, 401),
                ({}, 401),
            ):
                answer = await client.request(method, path, json=body, headers=headers)
                assert answer.status_code == status, (method, path, answer.text)
                error = answer.json()["error"]
                assert error["code"] == status and isinstance(error["message"], str)
                if status == 403:
                    assert error["message"] == "This operation requires the operator key"
        # The operator key is no API key: the key routes refuse it.
        as_key = await client.get("/key", headers=_operator(stack))
        credits = (await client.get("/credits", headers=manager.headers)).json()["data"]
    assert as_key.status_code == 401
    assert credits["total_credits"] == 0  # nothing was added


def _fuzz_operator_routes(
    port: int, operator_key: str, workspace_id: str, log: list[str]
) -> tuple[Findings, Decimal]:
    """Raw hostile JSON members (NUL, lone surrogates, NaN, numbers beyond 64 bits or double
    range, deep nesting, any code point) in the operator routes' bodies; returns what was
    found and the sum of the credit amounts the gateway accepted."""
    findings = Findings()
    accepted = Decimal(0)
    auth = (b"Authorization", f"Bearer {operator_key}".encode())
    # Every operator route answers a JSON object with its `data`.
    document = {"type": "object", "required": ["data"]}
    created, updated = SuccessShape(201, document, {}), SuccessShape(200, document, {})
    routes = st.sampled_from(
        [
            ("POST", "/workspaces", {"name": "fuzzed"}, "name"),
            ("POST", "/workspaces", {"name": "fuzzed"}, "intern_programme"),
            ("PATCH", f"/workspaces/{workspace_id}", {}, "intern_programme"),
            ("POST", f"/workspaces/{workspace_id}/keys", {"name": "k"}, "name"),
            ("POST", f"/workspaces/{workspace_id}/credits", {"amount": 1}, "amount"),
        ]
    )

    @fuzz_settings(40)
    @hypothesis.given(route=routes, raw=raw_values)
    @hypothesis.example(route=("POST", "/workspaces", {}, "name"), raw='"a\\u0000b"')
    @hypothesis.example(route=("POST", "/workspaces", {}, "name"), raw='"\\u0434\\u0432"')
    @hypothesis.example(
        route=("POST", f"/workspaces/{workspace_id}/credits", {}, "amount"), raw="1e400"
    )
    @hypothesis.example(
        route=("POST", f"/workspaces/{workspace_id}/credits", {}, "amount"),
        raw="18446744073709551616",
    )
    def fuzz(route: tuple[str, str, dict[str, object], str], raw: str) -> None:
        nonlocal accepted
        method, path, base, member = route
        mark = len(log)
        answer = raw_request(
            port,
            method,
            f"/api/v1{path}",
            [auth, (b"Content-Type", b"application/json")],
            body_with(base, member, raw),
        )
        shape = created if method == "POST" else updated
        problems = answer_problems(answer, shape)
        logged = server_errors_since(log, mark) if problems else ""
        findings.record(answer, problems, f"{method} {path} {member}; {logged}")
        if answer.status == 201 and path.endswith("/credits"):
            accepted += Decimal(str(json.loads(answer.body)["purchase"]["amount"]))

    fuzz()
    return findings, accepted


async def test_operator_routes_fuzz(stack: Stack, unique: str) -> None:
    operator = _operator(stack)
    async with httpx.AsyncClient(base_url=stack.base_url) as client:
        created = await client.post("/workspaces", json={"name": f"fz-{unique}"}, headers=operator)
        workspace_id = created.json()["data"]["id"]
        findings, accepted = await asyncio.to_thread(
            _fuzz_operator_routes,
            stack.gateway.http_port,
            operator["Authorization"].removeprefix("Bearer "),
            workspace_id,
            stack.gateway.output,
        )
        listed = (await client.get("/workspaces?limit=100", headers=operator)).json()["data"]
    # Money follows what the gateway accepted, to the micro-dollar.
    (workspace,) = [w for w in listed if w["id"] == workspace_id]
    findings.expect(
        Decimal(str(workspace["total_credits"])) == accepted,
        f"total_credits {workspace['total_credits']} != accepted {accepted}",
    )
    findings.check("operator routes")
