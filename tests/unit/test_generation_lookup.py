"""GET /generation's domain (server/observability/generations.py): a stored transcription
read back by its id in OpenRouter's shape; another workspace's id or an unknown one is 404
(server/auth.py `visible`; who sees what: tests/unit/test_visibility.py)."""

from __future__ import annotations

import pytest
from openrouter import components

from server.auth import visible
from server.errors import GatewayError
from server.observability.generations import (
    find_generation,
    generation_document,
    generation_not_found,
)
from server.transcription.request import TranscriptionInput
from testkit.audio import fixture
from testkit.domain import Domain


async def test_a_transcription_is_found_by_its_generation_id_in_its_workspace_only(
    domain: Domain,
) -> None:
    issued = await domain.funded_key("gen-owner")
    other = await domain.funded_key("gen-other")
    request = TranscriptionInput(
        model="unit/ok",
        audio=fixture("hello"),
        claimed_format="wav",
        filename="hello.wav",
        audio_param="file",
        session_id="sess-1",
        user="user-7",
    )
    async with domain.sessions() as session:
        principal = await domain.principal(issued)
        result = await domain.transcriber().transcribe(session, principal, request)
    async with domain.sessions() as session:
        owner, stranger = principal, await domain.principal(other)
        record = visible(
            owner,
            await find_generation(session, result.generation_id),
            generation_not_found(result.generation_id),
        )
        for caller, wanted in (
            (stranger, result.generation_id),
            (owner, "gen_unknown"),
            (owner, ""),
        ):
            with pytest.raises(GatewayError) as missing:
                visible(
                    caller, await find_generation(session, wanted), generation_not_found(wanted)
                )
            assert missing.value.status == 404
    document = generation_document(record)
    assert document["id"] == result.generation_id and document["model"] == "unit/ok"
    assert document["provider_name"] == "alpha" and document["api_type"] == "stt"
    assert document["total_cost"] == result.cost_micros / 1_000_000
    assert document["session_id"] == "sess-1" and document["external_user"] == "user-7"
    assert document["status"] == "completed" and document["is_byok"] is False
    assert isinstance(document["latency"], int)
    # Every member the official SDK's model requires is there.
    parsed = components.GenerationResponse.model_validate({"data": document}).data
    assert parsed.id == result.generation_id and parsed.tokens_prompt is None
