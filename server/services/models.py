"""Models service: GET /api/v1/models (model discovery as OpenRouter answers it)."""

from __future__ import annotations

from collections.abc import Callable

import grpc

from server.auth import Authenticator
from server.clock import Clock
from server.contract import models_pb2, models_pb2_grpc
from server.db.engine import SessionFactory
from server.guardrails.cache import GuardrailsCache
from server.routing.catalog import LOCAL_ADAPTERS, Catalog, Model
from server.routing.listing import ListedModel, ModelQuery, list_models
from server.services.rpc import metadata_of, null, nullable_string


def model_message(listed: ListedModel) -> models_pb2.Model:
    model = listed.model
    return models_pb2.Model(
        id=model.id,
        canonical_slug=model.id,
        name=model.name,
        created=model.video.created if model.video is not None else 0,
        description="",
        context_length=null(),
        architecture=models_pb2.ModelArchitecture(
            input_modalities=listed.input_modalities,
            output_modalities=listed.output_modalities,
            modality=nullable_string(listed.modality),
            instruct_type=null(),
        ),
        pricing=models_pb2.ModelPricing(
            prompt="0", completion="0", request="0", per_second=listed.per_second_usd
        ),
        top_provider=models_pb2.TopProvider(
            is_moderated=False, context_length=null(), max_completion_tokens=null()
        ),
        per_request_limits=null(),
        supported_parameters=listed.supported_parameters,
        default_parameters=null(),
        supported_voices=null(),
        hugging_face_id=null(),
        links=models_pb2.ModelLinks(details=f"/api/v1/models/{model.id}/endpoints"),
        available=listed.available,
        unavailable_reason=nullable_string(listed.unavailable_reason),
        endpoints=[
            models_pb2.ModelEndpoint(
                provider=e.provider, accepts_byok=e.adapter not in LOCAL_ADAPTERS
            )
            for e in model.endpoints
        ],
    )


def every_model(_: Model) -> bool:
    return True


class ModelsService(models_pb2_grpc.ModelsServicer):
    def __init__(
        self,
        auth: Authenticator,
        sessions: SessionFactory,
        catalog: Catalog,
        clock: Clock,
        guardrails: GuardrailsCache | None = None,
    ) -> None:
        # The caller's guardrails, cached under the principal stamp like the caller itself.
        self._guardrails = guardrails if guardrails is not None else GuardrailsCache(auth.stamp)
        self._auth = auth
        self._sessions = sessions
        self._catalog = catalog
        self._clock = clock

    async def ListModels(
        self, request: models_pb2.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> models_pb2.ModelsListResponse:
        query = ModelQuery(
            output_modalities=request.output_modalities
            if request.HasField("output_modalities")
            else None,
            input_modalities=request.input_modalities
            if request.HasField("input_modalities")
            else None,
            offset=request.offset if request.HasField("offset") else None,
            limit=request.limit if request.HasField("limit") else None,
        )
        metadata = metadata_of(context)
        allows: Callable[[Model], bool] = every_model
        # OpenRouter lists models without a key; with one, the workspace's guardrails apply.
        if any(name.lower() == "authorization" for name, _ in metadata):
            principal = self._auth.cached(metadata)
            guardrails = (
                None
                if principal is None
                else self._guardrails.cached(principal.workspace.id, principal.key.hash)
            )
            if guardrails is None:  # a read is due (the stamp's, or a miss)
                async with self._sessions() as session:
                    principal = await self._auth.authenticate(session, metadata)
                    guardrails = await self._guardrails.of(
                        session, principal.workspace.id, principal.key.hash
                    )
            allows = guardrails.allows
        page = list_models(self._catalog, query, self._clock.now().date(), allows)
        return models_pb2.ModelsListResponse(
            data=[model_message(listed) for listed in page.models],
            links=models_pb2.ModelsListLinks(next=nullable_string(page.next_url)),
            total_count=page.total_count,
        )
