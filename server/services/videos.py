"""Videos service: submit, poll, download and list video models."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import date
from typing import Any

import grpc
from google.api import httpbody_pb2
from google.protobuf import json_format, struct_pb2

from server.auth import Authenticator, Principal
from server.byok.cache import NO_KEYS, SealedKeys
from server.byok.routing import ByokRouting, billing_plan
from server.clock import Clock
from server.contract import videos_pb2, videos_pb2_grpc
from server.db.engine import SessionFactory
from server.db.models import VideoJob
from server.db.writer import Writer
from server.errors import GatewayError
from server.guardrails.cache import GuardrailsCache
from server.guardrails.policy import Guardrails
from server.limits.admission import EnforcedLimits, Limits
from server.observability.metrics import Metrics
from server.providers.video import VideoAdapter, can_continue
from server.routing.catalog import Catalog, Model
from server.routing.fallback import no_provider
from server.routing.readiness import model_problem
from server.services.rpc import (
    answer_with_status,
    header_value,
    list_or_null,
    metadata_of,
    null,
)
from server.videos import jobs
from server.videos.cancel import cancel_job
from server.videos.content import ContentStore
from server.videos.ranges import Unsatisfiable, byte_range
from server.videos.request import parse_video_request


def _job_message(job: Any) -> videos_pb2.VideoJob:
    document = jobs.job_document(job)
    if "usage" not in document:  # strings only (every job but a completed one): no parser
        return videos_pb2.VideoJob(**document)
    return json_format.ParseDict(document, videos_pb2.VideoJob())


def _bool_or_null(flag: bool | None) -> struct_pb2.Value:
    return null() if flag is None else struct_pb2.Value(bool_value=flag)


def model_message(model: Model, today: date) -> videos_pb2.VideoModel:
    caps = model.video
    assert caps is not None
    problem = model_problem(model, today)
    pricing = struct_pb2.Value()
    # OpenRouter's SKU map: the base per-second price, then each output priced apart.
    pricing.struct_value.update(
        {
            "per_second": str(model.price_per_second),
            **{f"per_second_{output}": str(price) for output, price in model.output_prices},
        }
    )
    upscale = null()
    if caps.upscaling:
        upscale = struct_pb2.Value()
        upscale.struct_value.update({"min": None, "max": None})
    return videos_pb2.VideoModel(
        id=model.id,
        canonical_slug=model.id,
        name=model.name,
        created=caps.created,
        supported_resolutions=list_or_null(caps.resolutions),
        supported_aspect_ratios=list_or_null(caps.aspect_ratios),
        supported_sizes=list_or_null(caps.sizes),
        supported_durations=list_or_null(caps.durations),
        supported_frame_images=list_or_null(caps.frame_images),
        upscale_factor=upscale,
        creativity=null(),
        generate_audio=_bool_or_null(caps.generate_audio),
        seed=_bool_or_null(caps.seed),
        allowed_passthrough_parameters=list(caps.passthrough),
        pricing_skus=pricing,
        hugging_face_id=null(),
        available=problem is None,
        unavailable_reason=null() if problem is None else struct_pb2.Value(string_value=problem),
    )


class VideosService(videos_pb2_grpc.VideosServicer):
    def __init__(
        self,
        auth: Authenticator,
        sessions: SessionFactory,
        clock: Clock,
        catalog: Catalog,
        store: ContentStore,
        limits: Limits,
        writer: Writer,
        wake_worker: asyncio.Event | None = None,
        byok: ByokRouting | None = None,
        *,
        adapters: Mapping[str, VideoAdapter] | None = None,
        provider_cancel: Callable[[VideoJob], Awaitable[None]] | None = None,
        guardrails: GuardrailsCache | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        # Counts admissions when the limits are the enforced ones, whose plain credit hold
        # jobs.store_job may place with the job row in one statement.
        self._admitted = (
            metrics.admissions.labels("admitted").inc
            if metrics is not None and isinstance(limits, EnforcedLimits)
            else None
        )
        # The caller's guardrails and its workspace's sealed BYOK keys, cached under the
        # principal stamp like the caller itself (server/db/stamp.py).
        self._guardrails = guardrails if guardrails is not None else GuardrailsCache(auth.stamp)
        self._provider_cancel = provider_cancel
        self._byok = byok  # None: the operator's endpoints only
        self._adapters = adapters or {}
        self._auth = auth
        self._sessions = sessions
        self._clock = clock
        self._catalog = catalog
        self._store = store
        self._limits = limits
        self._writer = writer
        self._wake = wake_worker

    def _cached(self, principal: Principal | None) -> tuple[Guardrails, SealedKeys] | None:
        """The caller's guardrails and BYOK keys with no database work, or None: read them."""
        if principal is None:
            return None
        workspace_id = principal.workspace.id
        guardrails = self._guardrails.cached(workspace_id, principal.key.hash)
        sealed = NO_KEYS if self._byok is None else self._byok.cached(workspace_id)
        if guardrails is None or sealed is None:
            return None
        return guardrails, sealed

    async def _caller(
        self, context: grpc.aio.ServicerContext
    ) -> tuple[Principal, Guardrails, SealedKeys]:
        """Who calls, its guardrails and its workspace's sealed BYOK keys: from the process's
        caches, with a session only when one of them needs a read (the stamp's, once a
        second, or a miss)."""
        metadata = metadata_of(context)
        principal = self._auth.cached(metadata)
        cached = self._cached(principal)
        if principal is not None and cached is not None:
            return principal, *cached
        async with self._sessions() as session:
            principal = await self._auth.authenticate(session, metadata)
            workspace_id = principal.workspace.id
            guardrails = await self._guardrails.of(session, workspace_id, principal.key.hash)
            sealed = (
                NO_KEYS if self._byok is None else await self._byok.sealed(session, workspace_id)
            )
        return principal, guardrails, sealed

    async def CreateVideo(
        self, request: videos_pb2.CreateVideoRequest, context: grpc.aio.ServicerContext
    ) -> videos_pb2.VideoJob:
        principal, guardrails, sealed = await self._caller(context)
        video = parse_video_request(
            request, self._catalog, header_value(context, "x-session-id"), self._clock.now().date()
        )
        endpoints = guardrails.endpoints(video.model)
        guardrails.check_video_duration(video.duration)
        guardrails.check_cost(jobs.estimate_micros(video))
        continuation = None
        if video.previous_job_id is not None:
            async with self._sessions() as session:
                continuation = await jobs.continuation_of(
                    session,
                    principal,
                    video,
                    lambda endpoint: can_continue(self._adapters.get(endpoint.adapter)),
                )
        billing = None
        if self._byok is not None:
            planned = self._byok.planned(
                sealed,
                workspace_id=principal.workspace.id,
                key_hash=principal.key.hash,
                model_id=video.model.id,
                endpoints=endpoints,
                user=video.user,
                now=self._clock.now(),
            )
            billing = billing_plan(planned, jobs.estimate_micros(video), self._byok.fees)
            usable = any(e.available for e in planned)
        else:
            usable = any(e.available for e in endpoints)
        if not usable:  # refused now, not by a job that fails later; nothing written
            raise no_provider(video.model.id, endpoints)
        # No session is held (usually none was opened: the caches answered; on SQLite a
        # session's connection is the process's only one): the hold and the job row go to
        # the group-commit writer, and the 202 leaves once their batch has committed.
        row = await self._writer.run(
            functools.partial(
                jobs.store_job,
                principal=principal,
                video=video,
                now=self._clock.now(),
                default_callback_url=principal.workspace.default_callback_url,
                limits=self._limits,
                # The worker uses only these endpoints when guardrails restrict them.
                allowed_providers=[e.provider for e in endpoints] if guardrails.rules else None,
                continuation=continuation,
                billing=billing,
                budgets=guardrails.budgets,
                admitted=self._admitted,
            )
        )
        if self._wake is not None:
            self._wake.set()
        await answer_with_status(context, 202)
        # A new job is pending: its document is its id, polling URL and status.
        job_id = row["id"]
        return videos_pb2.VideoJob(
            id=job_id, polling_url=jobs.polling_url(job_id), status=row["status"]
        )

    async def GetVideo(
        self, request: videos_pb2.GetVideoRequest, context: grpc.aio.ServicerContext
    ) -> videos_pb2.VideoJob:
        async with self._sessions() as session:
            principal = await self._auth.authenticate(session, metadata_of(context))
            job = await jobs.find_job(session, principal, request.job_id)
        return _job_message(job)

    async def CancelVideo(
        self, request: videos_pb2.CancelVideoRequest, context: grpc.aio.ServicerContext
    ) -> videos_pb2.VideoJob:
        async with self._sessions() as session:
            principal = await self._auth.authenticate(session, metadata_of(context))
        job = await cancel_job(
            self._sessions, principal, request.job_id, self._clock.now(), self._provider_cancel
        )
        return _job_message(job)

    async def GetVideoContent(
        self, request: videos_pb2.GetVideoContentRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[httpbody_pb2.HttpBody]:
        async with self._sessions() as session:
            principal = await self._auth.authenticate(session, metadata_of(context))
            job = await jobs.find_job(session, principal, request.job_id)
        index = request.index if request.HasField("index") else 0
        size = await jobs.check_content(job, index, self._store)
        try:
            span = byte_range(header_value(context, "range"), size)
        except Unsatisfiable as refused:
            raise GatewayError(
                416, str(refused), headers={"Content-Range": f"bytes */{refused.size}"}
            ) from None
        if span is None:
            await context.send_initial_metadata((("accept-ranges", "bytes"),))
            start, end = 0, None
        else:
            await answer_with_status(
                context,
                206,
                (
                    ("content-range", span.content_range),
                    # gRPC metadata cannot carry content-length itself: the facade sets it
                    ("x-content-length", str(span.end - span.start)),
                    ("accept-ranges", "bytes"),
                ),
            )
            start, end = span.start, span.end
        first = True
        async for chunk in self._store.read(job.id, index, start, end):
            # The first message's content type becomes the response's Content-Type.
            yield httpbody_pb2.HttpBody(content_type="video/mp4" if first else "", data=chunk)
            first = False

    async def ListVideoModels(
        self, request: videos_pb2.ListVideoModelsRequest, context: grpc.aio.ServicerContext
    ) -> videos_pb2.VideoModelsResponse:
        _principal, guardrails, _sealed = await self._caller(context)
        models = sorted(
            (m for m in self._catalog.of_kind("video") if guardrails.allows(m)),
            key=lambda m: m.id,
        )
        today = self._clock.now().date()
        return videos_pb2.VideoModelsResponse(data=[model_message(m, today) for m in models])
