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

from tests.conftest import Stack
from tests.support.admin import IssuedKey
from tests.support.audio import b64, fixture

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
