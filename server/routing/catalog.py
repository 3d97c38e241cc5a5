"""The provider catalog: which models exist, what they cost, and the endpoints serving each
in fallback order. Built-in TOML plus an optional operator file that adds or replaces models."""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

BUILT_IN = Path(__file__).resolve().parent / "catalog.toml"
MODEL_ID = re.compile(r"^[a-z0-9][a-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._:-]*$")
KINDS = ("stt", "video")
STT_ADAPTERS = ("openai", "pocketsphinx")
VIDEO_ADAPTERS = ("openai", "queue", "local")


class CatalogError(ValueError):
    """The catalog file is wrong; the message says where."""


@dataclass(frozen=True)
class Endpoint:
    provider: str  # provider slug: selects provider.options[slug]
    adapter: str
    base_url: str | None = None
    api_key_env: str | None = None
    model: str | None = None  # the provider's own model name
    timeout_seconds: float = 120.0

    def credential(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    @property
    def available(self) -> bool:
        """An endpoint that needs a credential is usable only when it is configured."""
        return self.api_key_env is None or bool(self.credential())


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


def _strings(value: Any, where: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CatalogError(f"{where}: must be a list of strings")
    return tuple(value)


def _video_capabilities(table: dict[str, Any], where: str) -> VideoCapabilities:
    durations = table.get("durations")
    if durations is not None and (
        not isinstance(durations, list) or not all(isinstance(d, int) and d >= 1 for d in durations)
    ):
        raise CatalogError(f"{where}: durations must be a list of integers >= 1")
    return VideoCapabilities(
        resolutions=_strings(table.get("resolutions"), f"{where} resolutions"),
        aspect_ratios=_strings(table.get("aspect_ratios"), f"{where} aspect_ratios"),
        sizes=_strings(table.get("sizes"), f"{where} sizes"),
        durations=tuple(durations) if durations is not None else None,
        frame_images=_strings(table.get("frame_images"), f"{where} frame_images"),
        generate_audio=table.get("generate_audio"),
        seed=table.get("seed"),
        input_reference_types=_strings(table.get("input_reference_types"), where) or ("image_url",),
        upscaling=bool(table.get("upscaling", False)),
        prompt_optional_with_images=bool(table.get("prompt_optional_with_images", False)),
        default_resolution=table.get("default_resolution"),
        default_aspect_ratio=table.get("default_aspect_ratio"),
        default_duration=table.get("default_duration"),
        created=int(table.get("created", 0)),
        passthrough=_strings(table.get("passthrough_parameters"), where) or (),
    )


@dataclass(frozen=True)
class Model:
    id: str
    name: str
    kind: str
    price_per_second: Decimal
    endpoints: tuple[Endpoint, ...]
    verbose_json: bool = False
    video: VideoCapabilities | None = None

    @property
    def upstream_name(self) -> str:
        return self.id.split("/", 1)[1]


@dataclass(frozen=True)
class Catalog:
    models: dict[str, Model]

    def get(self, model_id: str) -> Model | None:
        return self.models.get(model_id)

    def of_kind(self, kind: str) -> list[Model]:
        return [m for m in self.models.values() if m.kind == kind]


def _require(table: dict[str, Any], key: str, where: str) -> Any:
    if key not in table:
        raise CatalogError(f"{where}: missing {key!r}")
    return table[key]


def _endpoint(table: dict[str, Any], kind: str, where: str) -> Endpoint:
    adapter = _require(table, "adapter", where)
    allowed = STT_ADAPTERS if kind == "stt" else VIDEO_ADAPTERS
    if adapter not in allowed:
        raise CatalogError(f"{where}: adapter must be one of {', '.join(allowed)}")
    base_url = table.get("base_url")
    if adapter in ("openai", "queue") and not base_url:
        raise CatalogError(f"{where}: adapter {adapter!r} needs base_url")
    return Endpoint(
        provider=_require(table, "provider", where),
        adapter=adapter,
        base_url=base_url.rstrip("/") if base_url else None,
        api_key_env=table.get("api_key_env"),
        model=table.get("model"),
        timeout_seconds=float(table.get("timeout_seconds", 120.0)),
    )


def _model(table: dict[str, Any], where: str) -> Model:
    model_id = _require(table, "id", where)
    if not isinstance(model_id, str) or not MODEL_ID.match(model_id):
        raise CatalogError(f"{where}: id must look like <provider_prefix>/<model_name>")
    where = f"{where} ({model_id})"
    kind = _require(table, "kind", where)
    if kind not in KINDS:
        raise CatalogError(f"{where}: kind must be one of {', '.join(KINDS)}")
    try:
        price = Decimal(str(_require(table, "price_per_second", where)))
    except InvalidOperation as exc:
        raise CatalogError(f"{where}: price_per_second must be a decimal string") from exc
    if not price.is_finite() or price < 0:
        raise CatalogError(f"{where}: price_per_second must be >= 0")
    endpoints = table.get("endpoints") or []
    if not endpoints:
        raise CatalogError(f"{where}: at least one [[models.endpoints]] is needed")
    return Model(
        id=model_id,
        name=table.get("name", model_id),
        kind=kind,
        price_per_second=price,
        endpoints=tuple(
            _endpoint(e, kind, f"{where} endpoint {i + 1}") for i, e in enumerate(endpoints)
        ),
        verbose_json=bool(table.get("verbose_json", False)),
        video=_video_capabilities(table, where) if kind == "video" else None,
    )


def _read(path: Path) -> dict[str, Model]:
    try:
        document = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise CatalogError(f"{path}: {exc}") from exc
    models: dict[str, Model] = {}
    for index, table in enumerate(document.get("models", [])):
        model = _model(table, f"{path} model {index + 1}")
        models[model.id] = model
    return models


def load_catalog(operator_file: str | os.PathLike[str] | None = None) -> Catalog:
    """The built-in catalog, with the operator's models added or replacing same-id ones."""
    models = _read(BUILT_IN)
    if operator_file:
        models.update(_read(Path(operator_file)))
    return Catalog(models)
