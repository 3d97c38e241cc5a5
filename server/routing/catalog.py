"""The provider catalog: which models exist, what they cost, and the endpoints serving each
in fallback order. Built-in TOML plus an optional operator file that adds or replaces models."""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PositiveInt,
    ValidationError,
    model_validator,
)
from pydantic_core import ErrorDetails

from server.config import SettingsError
from server.errors import not_found
from server.providers.endpoint import Endpoint
from server.validation import param_of

BUILT_IN = Path(__file__).resolve().parent / "catalog.toml"
MODEL_ID = re.compile(r"^[a-z0-9][a-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._:-]*$")
# Adapter names as the catalog spells them (server/providers/ holds one module each); the
# local ones need no base_url, every other one talks HTTP to its endpoint's base_url.
STT_ADAPTERS = ("openai", "azure-openai", "deepgram", "elevenlabs", "assemblyai", "pocketsphinx")
VIDEO_ADAPTERS = (
    "openai",
    "gemini",
    "vertex",
    "kling",
    "minimax",
    "seedance",
    "dashscope",
    "fal",
    "replicate",
    "queue",
    "local",
)
LOCAL_ADAPTERS = ("pocketsphinx", "local")


class CatalogError(SettingsError):
    """The catalog file is wrong; the message says where (file, line, key)."""


@dataclass(frozen=True)
class VideoCapabilities:
    """What a video model accepts; None means the parameter is not supported."""

    resolutions: tuple[str, ...] | None = None
    aspect_ratios: tuple[str, ...] | None = None
    sizes: tuple[str, ...] | None = None
    durations: tuple[int, ...] | None = None
    frame_images: tuple[str, ...] | None = None
    generate_audio: bool | None = None
    seed: bool | None = None
    input_reference_types: tuple[str, ...] = ("image_url",)
    upscaling: bool = False
    prompt_optional_with_images: bool = False
    default_resolution: str | None = None
    default_aspect_ratio: str | None = None
    default_duration: int | None = None
    created: int = 0
    passthrough: tuple[str, ...] = ()


@dataclass(frozen=True)
class Model:
    id: str
    name: str
    kind: str
    price_per_second: Decimal
    endpoints: tuple[Endpoint, ...]
    verbose_json: bool = False
    video: VideoCapabilities | None = None
    built_in: bool = False  # from the catalog shipped with the gateway, not the operator's
    # Video outputs priced apart (resolution or "WxH" size -> USD per second).
    output_prices: tuple[tuple[str, Decimal], ...] = ()
    # The provider's retirement date (UTC): from that day on the model is listed as
    # unavailable and requests for it are refused, so a retirement is a one-line change.
    retires: date | None = None
    # The provider pages the entry's model name, price and capabilities were confirmed on,
    # and the day they were read (required of built-in entries, optional for an operator's).
    sources: tuple[str, ...] = ()
    checked: date | None = None

    def retirement(self, today: date) -> str | None:
        """Why the model is no longer offered, from its retirement date on; None before."""
        if self.retires is None or today < self.retires:
            return None
        return f"retired on {self.retires.isoformat()}: its provider no longer serves it"

    def refuse_if_retired(self, today: date) -> None:
        """A request for a retired model: 404, naming the date."""
        if self.retires is not None and today >= self.retires:
            raise not_found(
                f"Model {self.id} was retired on {self.retires.isoformat()}:"
                " its provider no longer serves it"
            )

    @property
    def upstream_name(self) -> str:
        return self.id.split("/", 1)[1]

    def video_price(self, params: Mapping[str, Any]) -> Decimal:
        """USD per second of a video with these validated parameters: its size's or its
        resolution's own price where the catalog gives one, else price_per_second."""
        prices = dict(self.output_prices)
        size = f"{params.get('width')}x{params.get('height')}"
        for output in (size, params.get("resolution")):
            if isinstance(output, str) and output in prices:
                return prices[output]
        return self.price_per_second


@dataclass(frozen=True)
class Catalog:
    models: dict[str, Model]

    def get(self, model_id: str) -> Model | None:
        return self.models.get(model_id)

    def of_kind(self, kind: str) -> list[Model]:
        return [m for m in self.models.values() if m.kind == kind]


def _model_id(value: str) -> str:
    if not MODEL_ID.match(value):
        raise ValueError("id must look like <provider_prefix>/<model_name>")
    return value


def _price(value: Any) -> Any:
    # TOML gives a string ("0.001"), an integer or a float; a float goes through its text.
    return (
        Decimal(str(value))
        if isinstance(value, int | float) and not isinstance(value, bool)
        else value
    )


def _https(value: str) -> str:
    if not value.startswith("https://"):
        raise ValueError("must be an https:// link")
    return value


def _tuple(values: list[Any] | None) -> tuple[Any, ...] | None:
    return tuple(values) if values is not None else None


class _Table(BaseModel):
    """A TOML table: exact TOML types (no coercion), and no key that is not declared."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class _EndpointTable(_Table):
    provider: str
    adapter: str  # one of STT_ADAPTERS / VIDEO_ADAPTERS, checked against the model's kind
    base_url: str | None = None
    api_key_env: str | None = None
    secret_key_env: str | None = None  # a second credential (Kling signs with two keys)
    model: str | None = None
    timeout_seconds: float = Field(default=120.0, gt=0)
    api_version: str | None = None  # Azure OpenAI's api-version query parameter


class _ModelTable(_Table):
    id: Annotated[str, AfterValidator(_model_id)]
    name: str | None = None
    kind: Literal["stt", "video"]
    price_per_second: Annotated[
        Decimal, BeforeValidator(_price), Field(strict=False, ge=0, allow_inf_nan=False)
    ]
    # A video output's own price where the provider charges more for it, keyed by resolution
    # ("1080p") or size ("1024x1792"); every other output pays price_per_second.
    output_prices: dict[
        str,
        Annotated[Decimal, BeforeValidator(_price), Field(strict=False, ge=0, allow_inf_nan=False)],
    ] = {}
    verbose_json: bool = False
    endpoints: list[_EndpointTable] = Field(min_length=1)
    # What a video model accepts (kind = "video"); absent: the parameter is not supported.
    resolutions: list[str] | None = None
    aspect_ratios: list[str] | None = None
    sizes: list[str] | None = None
    durations: list[PositiveInt] | None = None
    frame_images: list[str] | None = None
    generate_audio: bool | None = None
    seed: bool | None = None
    input_reference_types: list[str] = ["image_url"]
    upscaling: bool = False
    prompt_optional_with_images: bool = False
    default_resolution: str | None = None
    default_aspect_ratio: str | None = None
    default_duration: PositiveInt | None = None
    created: int = 0
    passthrough_parameters: list[str] = []
    retires: date | None = None  # a TOML date (retires = 2026-09-24)
    # Where the entry's figures were confirmed (https links) and when (checked = 2026-11-27).
    sources: list[Annotated[str, AfterValidator(_https)]] | None = Field(default=None, min_length=1)
    checked: date | None = None

    @model_validator(mode="after")
    def _sources_with_their_date(self) -> _ModelTable:
        if (self.sources is None) != (self.checked is None):
            raise ValueError(
                "sources and checked go together: the pages and the day they were read"
            )
        return self

    @model_validator(mode="after")
    def _adapters_fit_kind(self) -> _ModelTable:
        allowed = STT_ADAPTERS if self.kind == "stt" else VIDEO_ADAPTERS
        for index, endpoint in enumerate(self.endpoints):
            where = f"endpoints[{index}]"
            if endpoint.adapter not in allowed:
                raise ValueError(f"{where}.adapter must be one of {', '.join(allowed)}")
            if endpoint.adapter not in LOCAL_ADAPTERS and not endpoint.base_url:
                raise ValueError(f"{where}: adapter {endpoint.adapter!r} needs base_url")
        offered = {*(self.resolutions or ()), *(self.sizes or ())}
        for output in self.output_prices:
            if self.kind != "video" or output not in offered:
                raise ValueError(
                    f"output_prices.{output}: not one of the model's resolutions or sizes"
                )
        return self

    def build(self) -> Model:
        video = None
        if self.kind == "video":
            video = VideoCapabilities(
                resolutions=_tuple(self.resolutions),
                aspect_ratios=_tuple(self.aspect_ratios),
                sizes=_tuple(self.sizes),
                durations=_tuple(self.durations),
                frame_images=_tuple(self.frame_images),
                generate_audio=self.generate_audio,
                seed=self.seed,
                input_reference_types=tuple(self.input_reference_types) or ("image_url",),
                upscaling=self.upscaling,
                prompt_optional_with_images=self.prompt_optional_with_images,
                default_resolution=self.default_resolution,
                default_aspect_ratio=self.default_aspect_ratio,
                default_duration=self.default_duration,
                created=self.created,
                passthrough=tuple(self.passthrough_parameters),
            )
        return Model(
            id=self.id,
            name=self.name or self.id,
            kind=self.kind,
            price_per_second=self.price_per_second,
            endpoints=tuple(
                Endpoint(
                    provider=e.provider,
                    adapter=e.adapter,
                    base_url=e.base_url.rstrip("/") if e.base_url else None,
                    api_key_env=e.api_key_env,
                    secret_key_env=e.secret_key_env,
                    model=e.model,
                    timeout_seconds=e.timeout_seconds,
                    api_version=e.api_version,
                )
                for e in self.endpoints
            ),
            verbose_json=self.verbose_json,
            video=video,
            output_prices=tuple(self.output_prices.items()),
            retires=self.retires,
            sources=tuple(self.sources or ()),
            checked=self.checked,
        )


class _CatalogFile(_Table):
    models: list[_ModelTable] = []


_KEY = re.compile(r"""^\s*["']?([A-Za-z0-9_-]+)["']?\s*[=.]""")


def _line_of(text: str, loc: tuple[str | int, ...]) -> int | None:
    """The line of the TOML text that sets `loc` (a pydantic error location such as
    ("models", 2, "endpoints", 0, "adapter")): tomllib keeps no positions, so the text is
    scanned for the table headers ([[models]] counted per array) and keys."""
    counts: dict[tuple[str, ...], int] = {}
    context: tuple[str | int, ...] = ()
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.split("#", 1)[0].strip()
        if stripped.startswith("["):
            array = stripped.startswith("[[")
            names = tuple(p.strip().strip("\"'") for p in stripped.strip("[]").split("."))
            if array:
                counts[names] = counts.get(names, 0) + 1
                for deeper in [k for k in counts if k[: len(names)] == names and k != names]:
                    del counts[deeper]
            path: list[str | int] = []
            for depth in range(1, len(names) + 1):
                path.append(names[depth - 1])
                if names[:depth] in counts:
                    path.append(counts[names[:depth]] - 1)
            context = tuple(path)
            if context[: len(loc)] == loc:
                return number
            continue
        key = _KEY.match(stripped)
        if key and (*context, key.group(1)) == loc[: len(context) + 1]:
            return number
    return None


def _problem(error: ErrorDetails) -> str:
    if error["type"] == "extra_forbidden":
        return "unknown key"
    if error["type"] == "missing":
        return "missing"
    return str(error["msg"]).removeprefix("Value error, ")


def _read(path: Path, *, built_in: bool = False) -> dict[str, Model]:
    try:
        text = path.read_text()
        document = tomllib.loads(text)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise CatalogError(f"{path}: {exc}") from exc
    try:
        parsed = _CatalogFile.model_validate(document)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            line = _line_of(text, error["loc"])
            where = f"{path}, line {line}" if line is not None else str(path)
            problems.append(f"{where}: {param_of(error['loc'])}: {_problem(error)}")
        raise CatalogError("; ".join(problems)) from None
    return {
        table.id: dataclasses.replace(table.build(), built_in=built_in) for table in parsed.models
    }


def load_catalog(operator_file: str | os.PathLike[str] | None = None) -> Catalog:
    """The built-in catalog, with the operator's models added or replacing same-id ones."""
    models = _read(BUILT_IN, built_in=True)
    if operator_file:
        models.update(_read(Path(operator_file)))
    return Catalog(models)


def served_by(
    catalog: Catalog, stt_adapters: Collection[str], video_adapters: Collection[str]
) -> Catalog:
    """The catalog restricted to the adapters this build registers (server/app.py). An
    operator's model naming an adapter that is not registered is a startup error (a typo or
    a build without it); a built-in one loses that endpoint (the model, if none is left), so
    a build is never refused for the catalog it ships with."""
    models: dict[str, Model] = {}
    for model in catalog.models.values():
        registered = stt_adapters if model.kind == "stt" else video_adapters
        absent = [e.adapter for e in model.endpoints if e.adapter not in registered]
        if absent and not model.built_in:
            raise CatalogError(
                f"model {model.id}: adapter {absent[0]!r} is not implemented in this build"
                f" (available {model.kind} adapters: {', '.join(sorted(registered))})"
            )
        kept = tuple(e for e in model.endpoints if e.adapter in registered)
        if kept:
            models[model.id] = dataclasses.replace(model, endpoints=kept)
    return Catalog(models)
