"""Generation records: one row per transcription or finished video job, for observability
(never audio, prompts or secret values), written in the transaction that charges for it."""

from __future__ import annotations

from sqlmodel.ext.asyncio.session import AsyncSession

from server.db.driver import fetch_rows, insert_statement
from server.db.models import Generation

_INSERT_GENERATION = insert_statement(Generation.__table__)


async def store_generation(session: AsyncSession, record: Generation) -> None:
    """Add the record to the caller's transaction."""
    await fetch_rows(session, _INSERT_GENERATION, record.model_dump())
