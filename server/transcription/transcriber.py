"""Speech-to-text as a billable, routed operation: validate, measure, hold, route with
fallback, settle, record."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from opentelemetry.trace import NoOpTracer, Tracer
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlmodel.ext.asyncio.session import AsyncSession

from server.auth import Principal
from server.billing.holds import (
    FINISH_TIMEOUT_SECONDS,
    Hold,
    drop_hold,
    finish_uncancelled,
    place_hold,
    release_hold,
    settle_hold,
)
from server.billing.money import micros_to_json_number, usd_to_micros
from server.billing.settlements import Settlements
from server.byok.routing import ByokRouting, billing_plan
from server.clock import Clock
from server.compute import ComputePool, PoolBusy, WorkerLost
from server.db.models import Generation
from server.db.writer import Writer
from server.errors import GatewayError, bad_request
from server.guardrails.cache import GuardrailsCache
from server.guardrails.policy import Guardrails, guardrails_of
from server.limits.admission import (
    AloneAdmission,
    Limits,
    is_free_count_alone,
    is_plain_credit_hold,
)
from server.limits.guardrail_budgets import GuardrailBudget
from server.limits.leases import BudgetLeases
from server.observability.generations import GENERATIONS, store_generation_row
from server.observability.logs import REQUEST_ID
from server.observability.metrics import Metrics
from server.observability.tracing import emit_generation_span
from server.providers.endpoint import Endpoint
from server.providers.stt import SttAdapter, SttCall, Transcript
from server.routing.catalog import Catalog, Model
from server.routing.cooldowns import Cooldowns
from server.routing.fallback import no_provider, route
from server.transcription.media import ProbedAudio, Refusal, probe_in_worker, probe_wav
from server.transcription.request import TranscriptionInput, from_http, from_http_in_worker

log = logging.getLogger("gateway.transcription")
# The gateway answers 504 itself this long before the caller's deadline, so its answer (and
# the released hold) arrives before the caller, or Envoy, gives up.
DEADLINE_MARGIN_SECONDS = 0.25
# A REST body up to this size is parsed on the event loop; a larger one in a decoder process
# (Transcriber.parse): handing a body over costs more than parsing a small one, and less
# than the stall of parsing a large one on the loop.
INLINE_PARSE_BYTES = 1024 * 1024
# A charge that commits after its answer (Settlements) and fails is tried again after each
# of these pauses (seconds) — its unit wrote nothing — then given up: not charged, counted.
CHARGE_RETRY_PAUSES = (0.1, 1.0)
# What json.dumps(..., separators=(",", ":")) writes; built once (dumps builds an encoder
# per call for any non-default argument).
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))


@dataclass(frozen=True)
class TranscriptionResult:
    request: TranscriptionInput
    transcript: Transcript
    seconds: Decimal
    cost_micros: int
    provider: str
    generation_id: str
    is_byok: bool = False  # served with the workspace's own provider key

    def body(self) -> dict[str, Any]:
        """The response object of the API reference (2.4)."""
        t = self.transcript
        body: dict[str, Any] = {
            "text": t.text,
            "usage": {
                "cost": micros_to_json_number(self.cost_micros),
                "input_tokens": t.input_tokens,
                "output_tokens": t.output_tokens,
                "seconds": float(self.seconds),
                "total_tokens": t.input_tokens + t.output_tokens,
                "is_byok": self.is_byok,
            },
        }
        if not self.request.verbose:
            return body
        body["task"] = "transcribe"
        body["language"] = t.language or self.request.language or "unknown"
        body["duration"] = float(self.seconds)
        body["segments"] = [
            {**s.extra, "id": s.id, "start": s.start, "end": s.end, "text": s.text}
            for s in t.segments
        ]
        if "word" in self.request.timestamp_granularities and t.words:
            body["words"] = [
                {**w.extra, "word": w.word, "start": w.start, "end": w.end} for w in t.words
            ]
        return body

    def json_body(self) -> bytes:
        """body() as the REST answer's compact JSON."""
        return _COMPACT_JSON.encode(self.body()).encode()


def _budget(deadline: float | None) -> float | None:
    """Seconds left before the gateway must answer the caller itself."""
    return None if deadline is None else deadline - time.monotonic() - DEADLINE_MARGIN_SECONDS


async def _end_reads(session: AsyncSession) -> None:
    """End the session's reads, if it made any: cached callers (the common case) made none,
    and a commit of no transaction still runs SQLAlchemy's whole commit for nothing
    (the sessions do not expire on commit)."""
    if session.in_transaction():
        await session.commit()


def price(model: Model, seconds: Decimal) -> int:
    return usd_to_micros(model.price_per_second * seconds)


class Transcriber:
    def __init__(
        self,
        catalog: Catalog,
        adapters: Mapping[str, SttAdapter],
        clock: Clock,
        limits: Limits,
        metrics: Metrics,
        tracer: Tracer,
        decoder: ComputePool,
        *,
        writer: Writer,
        byok: ByokRouting | None = None,
        cooldowns: Cooldowns | None = None,
        guardrails: GuardrailsCache | None = None,
        leases: BudgetLeases | None = None,
        settlements: Settlements | None = None,
    ) -> None:
        # Slices of callers' budgets this process admits against (None: a hold per request).
        self._leases = leases
        # Where a leased request's charge commits beside its answer (None: before it).
        self._settlements = settlements
        # The caller's guardrails, cached under the principal stamp (None: read each time).
        self._guardrails = guardrails
        # Admissions and settlements commit in the group-commit writer's batches.
        self._writer = writer
        self._cooldowns = cooldowns  # providers that asked to wait (None: none remembered)
        self._byok = byok  # None: no workspace keys (the operator's endpoints only)
        self._decoder = decoder  # where audio is decoded and measured
        self._catalog = catalog
        self._adapters = adapters
        self._clock = clock
        self._limits = limits
        # Where the limits admit a lone `:free` count by themselves (None: through the writer).
        self._alone = self._alone_on(limits, writer)
        self._metrics = metrics
        self._tracer = tracer

    def _model(self, request: TranscriptionInput) -> Model:
        model = self._catalog.get(request.model)
        if model is None or model.kind != "stt":
            raise bad_request(f"Unknown speech-to-text model {request.model!r}", param="model")
        model.refuse_if_retired(self._clock.now().date())
        if request.verbose and not model.verbose_json:
            raise bad_request(
                f"response_format verbose_json is not supported by {model.id}; use json",
                param="response_format",
            )
        return model

    async def _guardrails_of(self, session: AsyncSession, principal: Principal) -> Guardrails:
        workspace_id, key_hash = principal.workspace.id, principal.key.hash
        if self._guardrails is None:
            return await guardrails_of(session, workspace_id, key_hash)
        return await self._guardrails.of(session, workspace_id, key_hash)

    def _call(self, request: TranscriptionInput, model: Model, endpoint: Endpoint) -> SttCall:
        return SttCall(
            audio=request.audio,
            format=request.claimed_format or "wav",
            filename=request.filename,
            model=endpoint.model or model.upstream_name,
            language=request.language,
            prompt=request.prompt,
            verbose=request.verbose,
            temperature=request.temperature,
            timestamp_granularities=request.timestamp_granularities,
            # Only the serving provider's options are forwarded.
            options=dict(request.provider_options.get(endpoint.provider, {})),
        )

    async def transcribe(
        self,
        session: AsyncSession,
        principal: Principal,
        request: TranscriptionInput,
        time_remaining: float | None = None,
    ) -> TranscriptionResult:
        """Run the transcription; `time_remaining` is the caller's deadline (its gRPC deadline,
        or Envoy's route timeout): the providers get what is left of it."""
        model = self._model(request)
        deadline = None if time_remaining is None else time.monotonic() + time_remaining
        audio = self._measure_wav(request)
        if audio is None:
            # Decoding takes a while: end the reads so far (authentication) first, so that
            # no transaction or pooled connection (SQLite has one) is held through it.
            await _end_reads(session)
            try:
                async with asyncio.timeout(_budget(deadline)):
                    audio = await self._probe(request)
            except TimeoutError as exc:
                raise GatewayError(
                    504, "Operation aborted due to timeout: the request's deadline passed"
                ) from exc
        guardrails = await self._guardrails_of(session, principal)
        endpoints: Sequence[Endpoint] = guardrails.endpoints(model)
        if request.claimed_format is None or request.claimed_format != audio.format:
            request.claimed_format = audio.format
        cost = price(model, audio.seconds)
        guardrails.check_cost(cost)
        started = time.monotonic()
        started_at = self._clock.now()
        if self._byok is not None:
            endpoints = await self._byok.endpoints(
                session,
                workspace_id=principal.workspace.id,
                key_hash=principal.key.hash,
                model_id=model.id,
                endpoints=endpoints,
                user=request.user,
                now=started_at,
            )
        if not any(e.available for e in endpoints):  # before anything is held
            raise no_provider(model.id, guardrails.endpoints(model))
        fees = self._byok.fees if self._byok is not None else None
        billing = billing_plan(endpoints, cost, fees)
        admit = functools.partial(
            self._admit,
            principal=principal,
            model_id=model.id,
            estimate_micros=billing.credit_hold,
            byok_micros=cost if billing.byok_hold else None,
            is_byok=billing.only_byok and cost == 0,
            budgets=guardrails.budgets,
        )
        generation_id = f"gen_{secrets.token_hex(12)}"

        async def fail(holds: tuple[Hold, Hold | None], exc: BaseException) -> None:
            # Not cut short by the request's own cancellation (a gRPC deadline, a client
            # cancel or disconnect): the hold is given back on every path.
            await finish_uncancelled(
                self._fail(
                    session,
                    holds,
                    principal,
                    request,
                    model,
                    generation_id,
                    exc,
                    started,
                    started_at,
                )
            )

        # End the caller's reads (on SQLite its session holds the process's only connection),
        # then admit: against this process's lease of the key's budget when it can (no
        # transaction); a `:free` count alone on PostgreSQL in a transaction of its own
        # (_alone_on); else through the group-commit writer: concurrent requests' holds
        # share one commit. Either way the provider is called only once it is durable.
        await _end_reads(session)
        byok = billing.byok_hold or billing.only_byok
        leased = (
            await self._leases.admit(principal, billing.credit_hold)
            if self._leases is not None
            and is_plain_credit_hold(model.id, guardrails.budgets, byok=byok)
            else None
        )
        alone = (
            self._alone
            if leased is None
            and is_free_count_alone(model.id, billing.credit_hold, guardrails.budgets, byok=byok)
            else None
        )
        if leased is not None:
            holds: tuple[Hold, Hold | None] = (leased, None)
        elif alone is not None:
            holds = await self._admit_through(
                functools.partial(self._admit_alone, *alone, principal, model.id), fail
            )
        else:
            holds = await self._admit_through(functools.partial(self._writer.run, admit), fail)
        budget = _budget(deadline)
        try:
            async with asyncio.timeout(budget):
                routed = await route(
                    model.id,
                    endpoints,
                    lambda endpoint: self._adapters[endpoint.adapter].transcribe(
                        endpoint, self._call(request, model, endpoint)
                    ),
                    self._metrics,
                    "transcription",
                    self._cooldowns,
                )
        except TimeoutError as exc:
            # Providers' own timeouts are ProviderFailures: this is the caller's deadline.
            expired = GatewayError(
                504, "Operation aborted due to timeout: the request's deadline passed"
            )
            await fail(holds, expired)
            raise expired from exc
        except BaseException as exc:
            await fail(holds, exc)
            raise
        ended = time.monotonic()
        try:
            # The charge and the generation record commit together; once the provider has
            # answered, that finishes even if the caller leaves meanwhile.
            settle = functools.partial(
                self._settle,
                holds=holds,
                principal=principal,
                request=request,
                model=model,
                generation_id=generation_id,
                provider=routed.endpoint.provider,
                is_byok=routed.endpoint.is_byok,
                cost=cost,
                seconds=audio.seconds,
                started=started,
                ended=ended,
                started_at=started_at,
            )
            if leased is not None and self._settlements is not None and not routed.endpoint.is_byok:
                # Its amount stays held in the lease until the charge commits, beside the
                # answer (billing/settlements.py): what the credits pay is the cost. The
                # charge keeps none of the audio: the body's budget is given back with the
                # answer, and a charge may wait for the writer past it.
                slim = functools.partial(settle, request=dataclasses.replace(request, audio=b""))
                self._settlements.start(
                    principal.account.id,
                    self._charge_after_answer(slim, leased, generation_id, started_at),
                )
                charged = cost
            else:
                charged, record = await self._settle_through(settle, holds[0])
                # Committed now: the span of what was recorded.
                self._emit_span(record, started_at)
        except asyncio.CancelledError as cancelled:
            # The caller went away after the answer: settled — unless the settlement failed.
            if cancelled.__cause__ is not None:
                await fail(holds, cancelled.__cause__)
            raise
        except BaseException as exc:
            await fail(holds, exc)  # nothing half-written: no charge, and the hold given back
            raise
        return TranscriptionResult(
            request=request,
            transcript=routed.value,
            seconds=audio.seconds,
            cost_micros=charged,
            provider=routed.endpoint.provider,
            generation_id=generation_id,
            is_byok=routed.endpoint.is_byok,
        )

    async def _admit(
        self,
        session: AsyncSession,
        *,
        principal: Principal,
        model_id: str,
        estimate_micros: int,
        byok_micros: int | None,
        is_byok: bool,
        budgets: Sequence[GuardrailBudget],
    ) -> tuple[Hold, Hold | None]:
        """Admit the request: its credit hold (and free-request count), and the hold of a BYOK
        attempt's provider cost (`byok_micros`; None: none), which counts only where the key
        says (its limit, with include_byok_in_limit). In the caller's transaction: a unit of
        the writer's batch. A refusal raises and writes nothing."""
        hold = await self._limits.admit(
            session,
            principal,
            model_id=model_id,
            estimate_micros=estimate_micros,
            now=self._clock.now(),
            is_byok=is_byok,
            budgets=budgets,
        )
        byok_hold = (
            None
            if byok_micros is None
            else await place_hold(
                session,
                account_id=principal.account.id,
                key_hash=principal.key.hash,
                amount_micros=byok_micros,
                now=self._clock.now(),
                is_byok=True,
            )
        )
        return hold, byok_hold

    @staticmethod
    def _alone_on(limits: Limits, writer: Writer) -> tuple[AloneAdmission, AsyncEngine] | None:
        """Where a request whose whole admission is its `:free` count (is_free_count_alone)
        is admitted in a transaction of its own (limits/free_gate.py: one statement, one
        round trip, beside the writer), instead of as a unit of the writer's batch: the
        limits that can, on the writer's engine if it is PostgreSQL; None: through the
        writer. The guarantees, and the measurements that chose this, are in free_gate's
        docstring. Found once: the request's session is made only if the request reads."""
        engine = writer.engine
        if (
            isinstance(limits, AloneAdmission)
            and engine is not None
            and engine.dialect.name == "postgresql"
        ):
            return limits, engine
        return None

    async def _admit_alone(
        self, limits: AloneAdmission, engine: AsyncEngine, principal: Principal, model_id: str
    ) -> tuple[Hold, Hold | None]:
        hold = await limits.admit_alone(engine, principal, model_id=model_id, now=self._clock.now())
        return hold, None

    @staticmethod
    async def _admit_through(
        admit: Callable[[], Awaitable[tuple[Hold, Hold | None]]],
        fail: Callable[[tuple[Hold, Hold | None], BaseException], Awaitable[None]],
    ) -> tuple[Hold, Hold | None]:
        """Run `admit` (a unit of the writer's batch, or an admission alone); return its holds
        once committed. A caller cancelled meanwhile (a deadline, a client that went away)
        leaves nothing held: its admission may already be committing, so its end is awaited
        (bounded, not cut short by further cancellations) and what it held is given back
        (`fail`: released, and the failure recorded)."""
        admission = asyncio.ensure_future(admit())
        try:
            return await asyncio.shield(admission)
        except asyncio.CancelledError as cancelled:
            try:
                await finish_uncancelled(admission)
            except BaseException:  # refused, failed, or still cancelled: see below
                pass
            if admission.done() and not admission.cancelled() and admission.exception() is None:
                await fail(admission.result(), cancelled)
            raise

    async def _settle_through(
        self, settle: Callable[[AsyncSession], Awaitable[tuple[int, dict[str, Any]]]], hold: Hold
    ) -> tuple[int, dict[str, Any]]:
        """Run `settle` in the writer's batch to its end even if the caller is cancelled
        meanwhile (finish_uncancelled's contract: the writer waits, bounded, then raises
        CancelledError, chained from the failure if the settlement failed); once committed, a
        leased hold's lease learns that its row gave the amount up (even if the caller went
        away meanwhile)."""
        try:
            result = await self._writer.run(settle, finish_within=FINISH_TIMEOUT_SECONDS)
        except asyncio.CancelledError as cancelled:
            if cancelled.__cause__ is None and self._leases is not None:
                self._leases.settled(hold)  # committed; the caller went away meanwhile
            raise
        if self._leases is not None:
            self._leases.settled(hold)
        return result

    async def _charge_after_answer(
        self,
        settle: Callable[[AsyncSession], Awaitable[tuple[int, dict[str, Any]]]],
        hold: Hold,
        generation_id: str,
        started_at: datetime,
    ) -> None:
        """Commit a leased request's charge (its unit `settle`) once its answer is on its
        way; the lease holds its amount until then. A failed unit wrote nothing and is tried
        again (CHARGE_RETRY_PAUSES); given up, the amount goes back to the lease — the
        request is not charged — and that is logged and counted."""
        assert self._leases is not None
        for pause in (*CHARGE_RETRY_PAUSES, None):
            try:
                _, record = await self._writer.run(settle)
            except Exception as error:
                if pause is not None:
                    await asyncio.sleep(pause)
                    continue
                self._leases.released(hold)
                self._metrics.charge_lost(hold.amount_micros)
                log.error(
                    "charge of %s not recorded after its answer, not charged: %s",
                    generation_id,
                    type(error).__name__,
                )
                return
            self._leases.settled(hold)
            self._emit_span(record, started_at)
            return

    async def _settle(
        self,
        session: AsyncSession,
        *,
        holds: tuple[Hold, Hold | None],
        principal: Principal,
        request: TranscriptionInput,
        model: Model,
        generation_id: str,
        provider: str,
        is_byok: bool,
        cost: int,
        seconds: Decimal,
        started: float,
        started_at: datetime,
        ended: float | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """Charge the request (and record it); return what the credits paid, and the record.
        Served with the workspace's key: the provider cost goes to the BYOK counters, the
        platform fee to the credits. A unit of the writer's batch: it commits with the batch."""
        hold, byok_hold = holds
        now = self._clock.now()
        charged = cost
        if is_byok and self._byok is not None and byok_hold is not None:
            charged = await self._byok.fee_for(session, principal.account.id, cost, now)
            await settle_hold(
                session, byok_hold, cost_micros=cost, now=now, reference=generation_id
            )
        elif byok_hold is not None:
            await drop_hold(session, byok_hold)
        record = await self._record(
            session,
            principal,
            request,
            model,
            generation_id,
            store=False,  # inserted with the charge below (one statement on PostgreSQL)
            provider=provider,
            status="completed",
            cost=charged,
            seconds=seconds,
            started=started,
            ended=ended,
            started_at=started_at,
            is_byok=is_byok,
        )
        await settle_hold(
            session,
            hold,
            cost_micros=charged,
            now=now,
            reference=generation_id,
            row=(GENERATIONS, record),
        )
        return charged, record

    @staticmethod
    def _measure_wav(request: TranscriptionInput) -> ProbedAudio | None:
        """A PCM WAV measured in this process (media.probe_wav: a bounded walk over its
        chunk headers, no decoding, microseconds): what the provider is sent holds exactly
        the frames measured. None: the audio is for the decoder (`_probe`)."""
        wav = probe_wav(request.audio, request.audio_param)
        if wav is not None and wav.audio is not None:
            request.audio = wav.audio  # rebuilt to hold exactly what was measured
        return wav

    async def parse(
        self, raw: bytes, content_type: str, header_session_id: str | None
    ) -> TranscriptionInput:
        """A REST request's body (JSON or multipart) read into a TranscriptionInput: in this
        process up to INLINE_PARSE_BYTES, in a decoder process above. Parsing is CPU-bound
        and holds the GIL throughout (json.loads, base64, the multipart parser), so a large
        body parsed here, even in a thread, would stall every other request."""
        if len(raw) <= INLINE_PARSE_BYTES:
            return from_http(raw, content_type, header_session_id)
        parsed: TranscriptionInput = await self._in_decoder(
            lambda: bad_request("The request body could not be read"),
            from_http_in_worker,
            raw,
            content_type,
            header_session_id,
        )
        return parsed

    async def _probe(self, request: TranscriptionInput) -> ProbedAudio:
        """The audio decoded to its end and measured, in a worker process (media.probe);
        a refusal names the audio field. Nothing is held yet."""
        probed: ProbedAudio = await self._in_decoder(
            lambda: bad_request("The audio could not be decoded", param=request.audio_param),
            probe_in_worker,
            request.audio,
            request.claimed_format,
            request.audio_param,
        )
        return probed

    async def _in_decoder(
        self, lost_twice: Callable[[], GatewayError], fn: Callable[..., Any], *args: Any
    ) -> Any:
        """`fn(*args)` in a decoder process; a Refusal it returns is raised as the
        GatewayError it stands for. A full pool is a 503 with Retry-After; a decoder crash
        takes down every job of the pool, so each is tried once more in a fresh one, and a
        job that crashes it again is refused with `lost_twice()`."""
        for attempt in (1, 2):
            try:
                outcome = await self._decoder.run(fn, *args)
            except PoolBusy as busy:
                raise GatewayError(
                    503,
                    "The gateway is busy decoding audio; retry shortly",
                    retry_after_seconds=busy.retry_after,
                ) from busy
            except WorkerLost:
                if attempt == 2:
                    raise lost_twice() from None
                continue
            if isinstance(outcome, Refusal):
                raise GatewayError(outcome.status, outcome.message, outcome.metadata)
            return outcome
        raise AssertionError("unreachable")

    async def _fail(
        self,
        session: AsyncSession,
        holds: tuple[Hold, Hold | None],
        principal: Principal,
        request: TranscriptionInput,
        model: Model,
        generation_id: str,
        exc: BaseException,
        started: float,
        started_at: datetime,
    ) -> None:
        # A rollback expires every instance in the session, the caller's key, workspace and
        # account included, and reading an expired attribute here would load it outside
        # SQLAlchemy's greenlet (MissingGreenlet): the failure would go unrecorded. Detached
        # first, they keep what was read (the record below needs their ids, nothing more).
        session.expunge_all()
        try:
            await session.rollback()
        except Exception:
            # A statement cut off by the cancellation can leave the connection unusable:
            # drop it, so the release below runs on a fresh one.
            await session.invalidate()
        hold, byok_hold = holds
        if self._leases is not None:
            self._leases.released(hold)  # a leased hold: its lease's again, nothing to write
        if byok_hold is not None:
            await drop_hold(session, byok_hold)
        await release_hold(session, hold)
        message = exc.message if isinstance(exc, GatewayError) else "request did not complete"
        try:
            await self._record(
                session,
                principal,
                request,
                model,
                generation_id,
                provider=None,
                status="failed",
                cost=0,
                seconds=None,
                started=started,
                started_at=started_at,
                error=message,
            )
        except Exception as record_failure:  # the hold is released: that is what matters
            await session.rollback()
            log.warning(
                "failed generation %s not recorded: %s",
                generation_id,
                type(record_failure).__name__,
            )

    async def _record(
        self,
        session: AsyncSession,
        principal: Principal,
        request: TranscriptionInput,
        model: Model,
        generation_id: str,
        *,
        provider: str | None,
        status: str,
        cost: int,
        seconds: Decimal | None,
        started: float,
        started_at: datetime,
        error: str | None = None,
        is_byok: bool = False,
        commit: bool = True,
        store: bool = True,
        ended: float | None = None,
    ) -> dict[str, Any]:
        """The generation record (as its columns' values), stored unless `store` is off (the
        caller inserts it); with `commit`, committed and reported as a span (else the
        caller does both). Its latency runs from `started` to `ended` (the provider's
        answer; None: now)."""
        record = {
            "id": generation_id,
            "account_id": principal.account.id,
            "workspace_id": principal.workspace.id,
            "key_hash": principal.key.hash,
            "kind": "stt",
            "model": model.id,
            "provider": provider,
            "status": status,
            "cost_micros": cost,
            "is_byok": is_byok,
            "seconds": seconds,
            "latency_ms": int(((time.monotonic() if ended is None else ended) - started) * 1000),
            "session_id": request.session_id,
            "user": request.user,
            "trace": request.trace,
            "error": error,
            "created_at": self._clock.now(),
        }
        if not store:
            return record
        await store_generation_row(session, record)
        if commit:
            await session.commit()
            self._emit_span(record, started_at)
        return record

    def _emit_span(self, record: dict[str, Any], started_at: datetime) -> None:
        """Report a committed record as a span; with tracing off, not even the record object
        the span is built from is made."""
        if not isinstance(self._tracer, NoOpTracer):
            emit_generation_span(self._tracer, Generation(**record), started_at, REQUEST_ID.get())
