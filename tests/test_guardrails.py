"""Guardrails: a workspace's policy through the management API (with the official SDK) and
the CLI, enforced on transcriptions, video jobs and the model listing with 403
`metadata.guardrail`; nothing is held or charged for a blocked request."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from openrouter import OpenRouter

from server.db.models import CreditHold, LedgerEntry, VideoJob
from testkit.admin import IssuedKey
from testkit.eventually import eventually
from tests.conftest import Stack
from tests.test_transcription import audio_body


@dataclass
class Workspace:
    manager: IssuedKey  # a management key of the workspace
    member: IssuedKey  # an ordinary key of the same workspace

    @property
    def account_id(self) -> str:
        return self.member.workspace.account_id


@pytest.fixture
async def team(stack: Stack, unique: str) -> Workspace:
    workspace = await stack.admin.workspace(f"guard-{unique}")
    await stack.admin.credits(workspace, "50")
    return Workspace(
        await stack.admin.key(workspace, "manager", management=True),
        await stack.admin.key(workspace, "member"),
    )


async def guardrail(stack: Stack, team: Workspace, **body: Any) -> dict[str, Any]:
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{stack.base_url}/guardrails",
            json={"name": "policy", **body},
            headers=team.manager.headers,
        )
    assert response.status_code == 201, response.text
    return response.json()["data"]  # type: ignore[no-any-return]


async def post(stack: Stack, key: IssuedKey, path: str, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(timeout=60) as client:
        return await client.post(f"{stack.base_url}{path}", json=body, headers=key.headers)


def assert_blocked(response: httpx.Response, rule: str, guardrail_id: str) -> None:
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert error["code"] == 403 and error["message"].startswith("Blocked by guardrail")
    assert error["metadata"] == {
        "guardrail": rule,
        "guardrail_id": guardrail_id,
        "guardrail_name": "policy",
    }


async def assert_nothing_charged(stack: Stack, team: Workspace) -> None:
    account = team.account_id
    await stack.admin.no_hold_left(CreditHold.account_id == account)
    assert (
        await stack.admin.count(
            LedgerEntry, LedgerEntry.account_id == account, LedgerEntry.kind == "charge"
        )
        == 0
    )


# --- the management API --------------------------------------------------------------------------


async def test_sdk_guardrail_lifecycle(stack: Stack, team: Workspace, unique: str) -> None:
    async with OpenRouter(api_key=team.manager.key, server_url=stack.base_url) as sdk:
        created = await sdk.guardrails.create_async(
            name="eng",
            description="engineering policy",
            allowed_models=["fake/ok", "fake/echo"],
            ignored_providers=["alpha"],
        )
        data = created.data
        assert data.id.startswith("gr_") and data.name == "eng"
        assert data.workspace_id == team.member.workspace.id
        assert data.allowed_models == ["fake/echo", "fake/ok"]
        assert data.ignored_providers == ["alpha"] and data.allowed_providers is None
        assert data.limit_usd is None and data.include_byok_in_budgets is False
        listed = await sdk.guardrails.list_async()
        assert [g.id for g in listed.result.data] == [data.id]
        fetched = await sdk.guardrails.get_async(id=data.id)
        assert fetched.data.description == "engineering policy"
        updated = await sdk.guardrails.update_async(id=data.id, allowed_models=None, name="eng2")
        assert updated.data.allowed_models is None and updated.data.name == "eng2"
        assert updated.data.ignored_providers == ["alpha"], "what is not sent is kept"
        assert updated.data.updated_at is not None
        deleted = await sdk.guardrails.delete_async(id=data.id)
        assert deleted.DELETED is True
        assert (await sdk.guardrails.list_async()).result.data == []


async def test_management_rules(stack: Stack, team: Workspace, unique: str) -> None:
    base = f"{stack.base_url}/guardrails"
    other = await stack.admin.workspace(f"guard-other-{unique}")
    outsider = await stack.admin.key(other, "outsider", management=True)
    theirs = await guardrail(stack, team)
    async with httpx.AsyncClient() as client:
        assert (await client.get(base, headers=team.member.headers)).status_code == 403
        assert (
            await client.get(f"{base}/{theirs['id']}", headers=outsider.headers)
        ).status_code == 404
        for body, param in (
            ({"name": "x", "allowed_models": ["nope/model"]}, "allowed_models"),
            ({"name": "x", "allowed_providers": ["nobody"]}, "allowed_providers"),
            ({"name": "x", "allowed_models": "fake/ok"}, "allowed_models"),
            ({"name": "x", "max_cost_per_request_usd": -1}, "max_cost_per_request_usd"),
            ({"name": "x", "max_video_duration_seconds": 1.5}, "max_video_duration_seconds"),
            ({"name": "x", "max_video_duration_seconds": 0}, "max_video_duration_seconds"),
            ({"name": "x", "limit_usd": 10}, "reset_interval"),  # a budget needs both
            ({"name": "x", "limit_usd": 10, "reset_interval": "hourly"}, "reset_interval"),
            ({"name": ""}, "name"),
        ):
            refused = await client.post(base, json=body, headers=team.manager.headers)
            assert refused.status_code == 400, body
            assert refused.json()["error"]["metadata"]["param"] == param
        listed = await client.get(base, headers=team.manager.headers)
        assert [g["id"] for g in listed.json()["data"]] == [theirs["id"]], "nothing half-made"


# --- enforcement ---------------------------------------------------------------------------------


async def test_allowed_and_ignored_models(stack: Stack, team: Workspace) -> None:
    rule = await guardrail(stack, team, allowed_models=["fake/ok", "fake/tokens"])
    assert (
        await post(stack, team.member, "/audio/transcriptions", audio_body("fake/ok"))
    ).status_code == 200
    blocked = await post(stack, team.member, "/audio/transcriptions", audio_body("fake/echo"))
    assert_blocked(blocked, "allowed_models", rule["id"])
    second = await guardrail(stack, team, ignored_models=["fake/tokens"])
    blocked = await post(stack, team.member, "/audio/transcriptions", audio_body("fake/tokens"))
    assert_blocked(blocked, "ignored_models", second["id"])


async def test_providers_narrow_routing_or_block(stack: Stack, team: Workspace) -> None:
    rule = await guardrail(stack, team, allowed_providers=["beta"])
    # fake/echo: alpha echoes the form, beta answers "fake transcript": only beta is used.
    served = await post(stack, team.member, "/audio/transcriptions", audio_body("fake/echo"))
    assert served.status_code == 200 and served.json()["text"] == "fake transcript"
    blocked = await post(stack, team.member, "/audio/transcriptions", audio_body("fake/ok"))
    assert_blocked(blocked, "allowed_providers", rule["id"])


async def test_max_cost_per_request_blocks_before_anything_is_held(
    stack: Stack, team: Workspace
) -> None:
    rule = await guardrail(stack, team, max_cost_per_request_usd=0.5)
    blocked = await post(stack, team.member, "/audio/transcriptions", audio_body("fake/pricey"))
    assert_blocked(blocked, "max_cost_per_request", rule["id"])
    assert "1.075125 USD" in blocked.json()["error"]["message"]
    await assert_nothing_charged(stack, team)
    assert (
        await post(stack, team.member, "/audio/transcriptions", audio_body("fake/ok"))
    ).status_code == 200


async def test_video_duration_cost_and_listing(stack: Stack, team: Workspace) -> None:
    rule = await guardrail(
        stack,
        team,
        allowed_models=["fakevideo/frames", "fakevideo/sized"],
        max_video_duration_seconds=1,
    )
    body = {"model": "fakevideo/frames", "prompt": "a boat"}
    too_long = await post(stack, team.member, "/videos", {**body, "duration": 2})
    assert_blocked(too_long, "max_video_duration", rule["id"])
    other_model = await post(
        stack, team.member, "/videos", {**body, "model": "fakevideo/openai", "duration": 1}
    )
    assert_blocked(other_model, "allowed_models", rule["id"])
    await assert_nothing_charged(stack, team)
    assert await stack.admin.count(VideoJob, VideoJob.account_id == team.account_id) == 0
    accepted = await post(stack, team.member, "/videos", {**body, "duration": 1})
    assert accepted.status_code == 202
    async with httpx.AsyncClient() as client:
        listed = await client.get(f"{stack.base_url}/videos/models", headers=team.member.headers)
        everyone = await client.get(
            f"{stack.base_url}/videos/models", headers=(await _outside_key(stack)).headers
        )
    assert sorted(m["id"] for m in listed.json()["data"]) == ["fakevideo/frames", "fakevideo/sized"]
    assert len(everyone.json()["data"]) > 2, "another workspace's listing is not narrowed"


async def _outside_key(stack: Stack) -> IssuedKey:
    return await stack.admin.key(await stack.admin.workspace(f"free-{time.monotonic_ns()}"))


async def _finished(stack: Stack, key: IssuedKey, job_id: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as client:

        async def ended() -> dict[str, Any] | None:
            job = (
                await client.get(f"{stack.base_url}/videos/{job_id}", headers=key.headers)
            ).json()
            return job if job["status"] in ("completed", "failed") else None

        return await eventually(ended, within=60, interval=0.2, message=f"{job_id} ended")


async def test_the_video_worker_uses_only_allowed_providers(stack: Stack, team: Workspace) -> None:
    """fakevideo/fallback: `openai` fails to submit, `fal` works. Ignoring fal leaves only the
    failing one; allowing only fal skips the failing one."""
    ignored = await guardrail(stack, team, ignored_providers=["fal"])
    body = {"model": "fakevideo/fallback", "prompt": "a kite", "duration": 1}
    failed = await post(stack, team.member, "/videos", body)
    assert (await _finished(stack, team.member, failed.json()["id"]))["status"] == "failed"
    async with httpx.AsyncClient() as client:
        await client.delete(
            f"{stack.base_url}/guardrails/{ignored['id']}", headers=team.manager.headers
        )
    await guardrail(stack, team, allowed_providers=["fal"])
    submissions = len(stack.fake_video.submissions) if stack.fake_video else 0
    served = await post(stack, team.member, "/videos", body)
    assert (await _finished(stack, team.member, served.json()["id"]))["status"] == "completed"
    assert stack.fake_video is not None
    newer = stack.fake_video.submissions[submissions:]
    assert all("queue" in str(s.get("path", "queue")) for s in newer)


# The guardrails CLI (create, list, an unknown model refused, delete) runs in-process:
# tests/unit/test_cli_commands.py.
