"""Generation records: one row per transcription or finished video job, for observability
(never audio, prompts or secret values), written in the transaction that charges for it, and
read back by their id (GET /api/v1/generation) in OpenRouter's shape."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlmodel.ext.asyncio.session import AsyncSession

from server.billing.money import micros_to_json_number
from server.clock import rfc3339
from server.db.driver import fetch_rows, insert_statement
from server.db.models import Generation
from server.errors import GatewayError, bounded_text, not_found

# The table (and its INSERT) of the records: a settlement inserts one with its charge
# (server/billing/holds.py settle_hold's `row`).
GENERATIONS: sa.Table = Generation.__table__
_INSERT_GENERATION = insert_statement(GENERATIONS)
# OpenRouter's api_type for each kind of generation this gateway records.
API_TYPES = {"stt": "stt", "video": "video"}
# Members of OpenRouter's generation this gateway does not record: always null.
UNRECORDED = (
    "app_id",
    "cache_discount",
    "cancelled",
    "finish_reason",
    "http_referer",
    "moderation_latency",
    "native_finish_reason",
    "native_tokens_cached",
    "native_tokens_completion",
    "native_tokens_completion_images",
    "native_tokens_prompt",
    "native_tokens_reasoning",
    "num_fetches",
    "num_input_audio_prompt",
    "num_media_completion",
    "num_media_prompt",
    "num_search_results",
    "preset_id",
    "provider_responses",
    "router",
    "service_tier",
    "streamed",
    "tokens_completion",
    "tokens_prompt",
    "upstream_id",
    "upstream_inference_cost",
    "user_agent",
    "web_search_engine",
    "request_id",
    "response_cache_source_id",
)


async def store_generation(session: AsyncSession, record: Generation) -> None:
    """Add the record to the caller's transaction."""
    await store_generation_row(session, record.model_dump())


async def store_generation_row(session: AsyncSession, row: Mapping[str, Any]) -> None:
    """Add the record given as its columns' values to the caller's transaction: on hot paths,
    without building the ORM object (which costs more than the statement's own work)."""
    await fetch_rows(session, _INSERT_GENERATION, row)


async def find_generation(session: AsyncSession, generation_id: str) -> Generation | None:
    """The generation of that id, whoever's it is: the caller decides whether it may be seen
    (server/auth.py `visible`, answering `generation_not_found` otherwise)."""
    return await session.get(Generation, generation_id) if generation_id else None


def generation_not_found(generation_id: str) -> GatewayError:
    return not_found(f"Generation {bounded_text(generation_id, 100)!r} not found")


def generation_document(record: Generation) -> dict[str, Any]:
    """The record as OpenRouter's GET /generation answers (`data`); latency in ms."""
    cost = micros_to_json_number(record.cost_micros)
    return {
        "id": record.id,
        "model": record.model,
        "created_at": rfc3339(record.created_at),
        "origin": "",
        "data_region": "global",
        "api_type": API_TYPES.get(record.kind, record.kind),
        "provider_name": record.provider,
        "is_byok": record.is_byok,
        "total_cost": cost,
        "usage": cost,
        "latency": record.latency_ms,
        "generation_time": record.latency_ms,
        "session_id": record.session_id,
        "external_user": record.user,
        "workspace_id": record.workspace_id,
        "status": record.status,
        "error": record.error,
        **dict.fromkeys(UNRECORDED),
    }
