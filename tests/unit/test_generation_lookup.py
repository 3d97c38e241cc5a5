"""GET /generation's domain (server/observability/generations.py): a stored transcription
read back by its id in OpenRouter's shape; another workspace's id or an unknown one is 404."""

from __future__ import annotations

import pytest
from openrouter import components

from server.errors import GatewayError
from server.observability.generations import find_generation, generation_document
from server.transcription.request import TranscriptionInput
from tests.support.audio import fixture
from tests.support.domain import Domain


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
        record = await find_generation(session, issued.workspace.id, result.generation_id)
        for workspace, wanted in (
            (other.workspace.id, result.generation_id),
            (issued.workspace.id, "gen_unknown"),
            (issued.workspace.id, ""),
        ):
            with pytest.raises(GatewayError) as missing:
                await find_generation(session, workspace, wanted)
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
