"""Model discovery (GET /api/v1/models): the catalog's models as OpenRouter lists them, chosen
by output and input modality and paged. Prices are strings of USD, as OpenRouter publishes
them (https://openrouter.ai/docs/api_reference/models)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from urllib.parse import urlencode

from server.errors import bad_request
from server.routing.catalog import Catalog, Model
from server.routing.readiness import model_problem

OUTPUT_MODALITIES = (
    "text",
    "image",
    "embeddings",
    "audio",
    "video",
    "rerank",
    "decisions",
    "speech",
    "transcription",
)
INPUT_MODALITIES = ("text", "image", "file", "audio", "video")
ALL = "all"
# OpenRouter lists text-output models when output_modalities is absent; this gateway serves
# none, so a bare GET /models is an empty list, as it would be there for these models.
DEFAULT_OUTPUT = "text"
MAX_PAGE = 1000
DEFAULT_PAGE = 500
STT_PARAMETERS = ("language", "prompt", "response_format", "temperature", "timestamp_granularities")


@dataclass(frozen=True)
class ModelQuery:
    output_modalities: str | None = None
    input_modalities: str | None = None
    offset: int | None = None
    limit: int | None = None


@dataclass(frozen=True)
class ListedModel:
    model: Model
    input_modalities: tuple[str, ...]
    output_modalities: tuple[str, ...]
    supported_parameters: tuple[str, ...]
    available: bool  # not retired, and some endpoint has its credentials configured
    unavailable_reason: str | None = None  # why not, when not available

    @property
    def modality(self) -> str:
        return f"{'+'.join(self.input_modalities)}->{'+'.join(self.output_modalities)}"

    @property
    def per_second_usd(self) -> str:
        return usd_string(self.model.price_per_second)


@dataclass(frozen=True)
class ModelPage:
    models: list[ListedModel]
    total_count: int
    next_url: str | None


def usd_string(amount: Decimal) -> str:
    """A price as OpenRouter writes it: plain decimal notation, never an exponent."""
    return format(amount.normalize(), "f")


def _modalities(text: str | None, allowed: tuple[str, ...], param: str) -> set[str] | None:
    """The comma-separated modalities asked for; None: no filter ("all")."""
    names = [part.strip() for part in (text or "").split(",") if part.strip()]
    if ALL in names:
        return None
    unknown = [name for name in names if name not in allowed]
    if unknown or not names:
        raise bad_request(
            f"{param} must be a comma-separated list of {', '.join(allowed)} or {ALL}",
            param=param,
        )
    return set(names)


def describe(model: Model, today: date) -> ListedModel:
    """What OpenRouter's model listing says of one catalog model on `today` (UTC)."""
    if model.kind == "stt":
        inputs: tuple[str, ...] = ("audio",)
        outputs: tuple[str, ...] = ("transcription",)
        parameters: tuple[str, ...] = STT_PARAMETERS
    else:
        caps = model.video
        images = caps is not None and bool(caps.frame_images or caps.input_reference_types)
        inputs = ("text", "image") if images else ("text",)
        outputs = ("video",)
        parameters = ("prompt",)
        if caps is not None:
            declared = {
                "duration": caps.durations,
                "resolution": caps.resolutions,
                "aspect_ratio": caps.aspect_ratios,
                "size": caps.sizes,
                "frame_images": caps.frame_images,
                "generate_audio": caps.generate_audio,
                "seed": caps.seed,
            }
            parameters += tuple(name for name, value in declared.items() if value is not None)
    problem = model_problem(model, today)
    return ListedModel(
        model=model,
        input_modalities=inputs,
        output_modalities=outputs,
        supported_parameters=parameters,
        available=problem is None,
        unavailable_reason=problem,
    )


def list_models(
    catalog: Catalog,
    query: ModelQuery,
    today: date,
    allows: Callable[[Model], bool] = lambda _: True,
) -> ModelPage:
    """The catalog's models matching the query (and `allows`: the caller's guardrails), by
    id, one page of them."""
    outputs = _modalities(
        query.output_modalities or DEFAULT_OUTPUT, OUTPUT_MODALITIES, "output_modalities"
    )
    inputs = (
        _modalities(query.input_modalities, INPUT_MODALITIES, "input_modalities")
        if query.input_modalities is not None
        else None
    )
    if query.offset is not None and query.offset < 0:
        raise bad_request("offset must be 0 or more", param="offset")
    if query.limit is not None and not 1 <= query.limit <= MAX_PAGE:
        raise bad_request(f"limit must be between 1 and {MAX_PAGE}", param="limit")
    matching = [
        listed
        for listed in (
            describe(m, today) for m in sorted(catalog.models.values(), key=lambda m: m.id)
        )
        if allows(listed.model)
        and (outputs is None or outputs & set(listed.output_modalities))
        and (inputs is None or inputs & set(listed.input_modalities))
    ]
    if query.offset is None and query.limit is None:
        return ModelPage(matching, len(matching), None)
    offset = query.offset or 0
    limit = query.limit or DEFAULT_PAGE
    page = matching[offset : offset + limit]
    next_url = None
    if offset + limit < len(matching):
        params: dict[str, str | int] = {"offset": offset + limit, "limit": limit}
        if query.output_modalities is not None:
            params["output_modalities"] = query.output_modalities
        if query.input_modalities is not None:
            params["input_modalities"] = query.input_modalities
        next_url = f"/api/v1/models?{urlencode(params)}"
    return ModelPage(page, len(matching), next_url)
