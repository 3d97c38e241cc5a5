"""A model whose provider credentials are not configured, through Envoy: listed as such by
GET /videos/models, and a request for it is 503 naming what the operator must set."""

from __future__ import annotations

import httpx

from tests.conftest import Stack

# testkit/catalog.py: one endpoint, credential in GATEWAY_TEST_UNSET_KEY (never set).
UNCONFIGURED = "fakevideo/unavailable"


async def test_video_models_lists_an_unconfigured_model_as_such(stack: Stack, unique: str) -> None:
    workspace = await stack.admin.workspace(f"unconfigured-{unique}")
    issued = await stack.admin.key(workspace, "models")
    async with httpx.AsyncClient(timeout=30) as client:
        listed = await client.get(f"{stack.base_url}/videos/models", headers=issued.headers)
    assert listed.status_code == 200, listed.text
    by_id = {model["id"]: model for model in listed.json()["data"]}
    assert by_id[UNCONFIGURED]["available"] is False
    assert by_id[UNCONFIGURED]["unavailable_reason"] == (
        "the operator must set GATEWAY_TEST_UNSET_KEY"
    )
    assert by_id["local/renderer"]["available"] is True
    assert by_id["local/renderer"]["unavailable_reason"] is None


async def test_a_request_for_an_unconfigured_model_is_503_naming_the_variable(
    stack: Stack, unique: str
) -> None:
    workspace = await stack.admin.workspace(f"unconfigured-submit-{unique}")
    await stack.admin.credits(workspace, "10")
    issued = await stack.admin.key(workspace, "video")
    async with httpx.AsyncClient(timeout=30) as client:
        refused = await client.post(
            f"{stack.base_url}/videos",
            json={"model": UNCONFIGURED, "prompt": "a lighthouse"},
            headers=issued.headers,
        )
        key = (await client.get(f"{stack.base_url}/key", headers=issued.headers)).json()
    assert refused.status_code == 503, refused.text
    assert refused.json() == {
        "error": {
            "code": 503,
            "message": "No available provider meets the routing requirements: "
            f"{UNCONFIGURED} has no configured provider; the operator must set "
            "GATEWAY_TEST_UNSET_KEY",
        }
    }
    assert key["data"]["usage"] == 0  # nothing held or charged
