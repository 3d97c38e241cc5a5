"""Routes that code written for OpenRouter looks for, through Envoy with the official SDK:
GET /models, GET /generation, GET /key's extra members, GET /vault/secrets/{name} and
guardrail budgets. One case per route; the domain is tested in tests/unit."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import httpx
import pytest
from openrouter import OpenRouter

from testkit.admin import IssuedKey
from testkit.audio import b64, fixture
from tests.conftest import Stack

T = TypeVar("T")
SQLITE_ONLY = pytest.mark.parametrize("stack", ["sqlite"], indirect=True)


async def sdk(stack: Stack, key: str, call: Callable[[OpenRouter], T]) -> T:
    """One call with the official SDK (synchronous: run off the event loop)."""

    def run() -> T:
        with OpenRouter(api_key=key, server_url=stack.base_url) as client:
            return call(client)

    return await asyncio.to_thread(run)


@SQLITE_ONLY
async def test_sdk_lists_models_by_output_modality(stack: Stack, unique: str) -> None:
    workspace = await stack.admin.workspace(f"models-{unique}")
    issued = await stack.admin.key(workspace, "models")

    def listed(modalities: str) -> Callable[[OpenRouter], Any]:
        return lambda client: client.models.list(output_modalities=modalities)

    stt = (await sdk(stack, issued.key, listed("transcription"))).result
    assert stt.data and all(m.architecture.output_modalities == ["transcription"] for m in stt.data)
    ok = next(m for m in stt.data if m.id == "fake/ok")
    assert ok.architecture.input_modalities == ["audio"]
    assert ok.pricing.prompt == "0" and isinstance(ok.pricing.completion, str)
    video = (await sdk(stack, issued.key, listed("video"))).result
    ids = {m.id for m in video.data}
    assert "fakevideo/frames" in ids and not ids & {m.id for m in stt.data}
    assert stt.total_count == len(stt.data)
    async with httpx.AsyncClient() as client:
        # Without a key, as on OpenRouter; the per-second price and availability are extras.
        everything = (await client.get(f"{stack.base_url}/models?output_modalities=all")).json()
        bad = await client.get(f"{stack.base_url}/models?output_modalities=music")
    by_id = {m["id"]: m for m in everything["data"]}
    assert by_id.keys() >= ids | {m.id for m in stt.data}
    assert by_id["fakevideo/unavailable"]["available"] is False
    assert by_id["fake/ok"]["available"] is True and by_id["fake/ok"]["pricing"]["per_second"]
    assert bad.status_code == 400
    assert bad.json()["error"]["metadata"] == {"param": "output_modalities"}


@SQLITE_ONLY
async def test_sdk_reads_a_transcriptions_generation_by_its_header_id(
    stack: Stack, funded: IssuedKey
) -> None:
    body = {"model": "fake/ok", "input_audio": {"data": b64(fixture()), "format": "wav"}}
    async with httpx.AsyncClient(timeout=60) as client:
        answer = await client.post(
            f"{stack.base_url}/audio/transcriptions",
            json=body,
            headers={**funded.headers, "x-session-id": "compat-session"},
        )
        generation_id = answer.headers["x-generation-id"]
        stranger = await stack.admin.key(await stack.admin.workspace(f"gen-{generation_id}"))
        foreign = await client.get(
            f"{stack.base_url}/generation", params={"id": generation_id}, headers=stranger.headers
        )
    assert answer.status_code == 200 and generation_id.startswith("gen_")
    data = (
        await sdk(
            stack, funded.key, lambda client: client.generations.get_generation(id=generation_id)
        )
    ).data
    assert data.id == generation_id and data.model == "fake/ok"
    assert data.api_type == "stt" and data.session_id == "compat-session"
    assert data.total_cost == answer.json()["usage"]["cost"] and data.is_byok is False
    assert foreign.status_code == 404 and foreign.json()["error"]["code"] == 404


@SQLITE_ONLY
async def test_http2_clients_get_the_generation_id_as_a_header(
    stack: Stack, funded: IssuedKey
) -> None:
    """The server sends the id in its trailers; the facade makes it a response header for
    HTTP/2 clients too (and leaves no gRPC trailer)."""
    body = {"model": "fake/ok", "input_audio": {"data": b64(fixture()), "format": "wav"}}
    async with httpx.AsyncClient(http1=False, http2=True, timeout=60) as client:
        answer = await client.post(
            f"{stack.base_url}/audio/transcriptions", json=body, headers=funded.headers
        )
    assert answer.http_version == "HTTP/2" and answer.status_code == 200
    assert answer.headers["x-generation-id"].startswith("gen_")
    assert not {"grpc-status", "grpc-message"} & answer.headers.keys()


@SQLITE_ONLY
async def test_sdk_creates_an_expiring_key_and_reads_its_extra_members(
    stack: Stack, unique: str
) -> None:
    workspace = await stack.admin.workspace(f"expiry-{unique}")
    manager = await stack.admin.key(workspace, "manager", management=True)
    expires = datetime.now(UTC).replace(microsecond=0) + timedelta(days=2)

    def create(client: OpenRouter) -> Any:
        return client.api_keys.create(name="expiring", expires_at=expires, creator_user_id="u-1")

    created = await sdk(stack, manager.key, create)
    assert created.data.expires_at == expires
    current = (await sdk(stack, created.key, lambda c: c.api_keys.get_current_key_metadata())).data
    assert current.expires_at == expires and current.creator_user_id == "u-1"
    assert current.is_provisioning_key is False and current.is_management_key is False
    manager_view = await sdk(stack, manager.key, lambda c: c.api_keys.get_current_key_metadata())
    assert manager_view.data.is_provisioning_key is True
    listed = (await sdk(stack, manager.key, lambda c: c.api_keys.list())).data
    assert {k.name: k.expires_at for k in listed}["expiring"] == expires


@SQLITE_ONLY
async def test_vault_reads_one_secrets_metadata_on_both_routes(stack: Stack, unique: str) -> None:
    workspace = await stack.admin.workspace(f"vault1-{unique}", intern_programme=True)
    intern = await stack.admin.intern(workspace, "helper")
    issued = await stack.admin.key(workspace, "vault")
    value = "never-shown-7a1b"

    def store(client: OpenRouter) -> Any:
        client.vault.store_vault_secret(name="api_token", value=value, hosts=["api.example.com"])
        return client.vault.store_intern_vault_secret(
            intern_id=intern.id, name="own_token", value=value, hosts=["own.example.com"]
        )

    await sdk(stack, issued.key, store)
    base = f"{stack.base_url}/vault"
    async with httpx.AsyncClient(headers=issued.headers) as client:
        shared = await client.get(f"{base}/secrets/api_token")
        own = await client.get(f"{base}/interns/{intern.id}/secrets/own_token")
        not_the_interns = await client.get(f"{base}/interns/{intern.id}/secrets/api_token")
        effective = await client.get(f"{base}/interns/{intern.id}/effective-secrets")
    assert shared.status_code == 200 and own.status_code == 200
    assert shared.json()["data"]["hosts"] == ["api.example.com"]
    assert set(shared.json()["data"]) == {
        "name",
        "hosts",
        "fingerprint",
        "created_at",
        "updated_at",
    }
    assert own.json()["data"]["name"] == "own_token"
    assert value not in shared.text + own.text
    assert not_the_interns.status_code == 404
    scopes = {s["name"]: s["scope"] for s in effective.json()["data"]}
    assert scopes == {"api_token": "workspace", "own_token": "intern"}


@SQLITE_ONLY
async def test_sdk_guardrail_budget_assigned_to_a_key_refuses_past_it(
    stack: Stack, unique: str
) -> None:
    workspace = await stack.admin.workspace(f"budget-{unique}")
    await stack.admin.credits(workspace, "10")
    manager = await stack.admin.key(workspace, "manager", management=True)
    capped = await stack.admin.key(workspace, "capped")
    free = await stack.admin.key(workspace, "uncapped")

    def set_up(client: OpenRouter) -> Any:
        # 0.002 USD a day: one ~1.08 s transcription at 0.001 USD/s fits, a second does not.
        created = client.guardrails.create(name="tight", limit_usd=0.002, reset_interval="daily")
        gid = created.data.id
        assigned = client.guardrails.bulk_assign_keys(id=gid, key_hashes=[capped.hash])
        listed = client.guardrails.list_guardrail_key_assignments(id=gid)
        return created.data, assigned, listed.result

    guardrail, assigned, listed = await sdk(stack, manager.key, set_up)
    assert guardrail.limit_usd == 0.002 and guardrail.reset_interval == "daily"
    assert assigned.assigned_count == 1
    assert [(a.key_hash, a.key_name) for a in listed.data] == [(capped.hash, "capped")]
    body = {"model": "fake/ok", "input_audio": {"data": b64(fixture()), "format": "wav"}}
    url = f"{stack.base_url}/audio/transcriptions"
    async with httpx.AsyncClient(timeout=60) as client:
        first = await client.post(url, json=body, headers=capped.headers)
        second = await client.post(url, json=body, headers=capped.headers)
        other_key = await client.post(url, json=body, headers=free.headers)
    assert first.status_code == 200 and other_key.status_code == 200
    assert second.status_code == 403
    metadata = second.json()["error"]["metadata"]
    assert metadata["limit_source"] == "openrouter_guardrail_budget"
    assert metadata["limit_usd"] == 0.002
    assert metadata["spend_usd"] == first.json()["usage"]["cost"]
    assert metadata["resets_at"].endswith("T00:00:00.000Z")
    # GET /key lists the budget layers, and the spent one as the effective budget.
    status = (await sdk(stack, capped.key, lambda c: c.api_keys.get_current_key_metadata())).data
    (layer,) = status.budgets
    assert (layer.scope, layer.guardrail_id) == ("api_key", guardrail.id)
    assert layer.spend_usd == metadata["spend_usd"] and layer.limit_usd == 0.002
    assert status.effective_budget is not None and status.effective_budget.scope == "api_key"
    unbudgeted = await sdk(stack, free.key, lambda c: c.api_keys.get_current_key_metadata())
    assert unbudgeted.data.budgets == [] and unbudgeted.data.effective_budget is None
