"""POST /videos: every field of the API reference validated against the model's
capabilities into the parameters a provider gets."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from typing import Annotated, Any
from urllib.parse import urlsplit

from google.protobuf import json_format
from pydantic import AfterValidator, Field, model_validator

from server.errors import bad_request
from server.routing.catalog import Catalog, Model, VideoCapabilities
from server.validation import (
    BoundedId,
    Provider,
    Shape,
    StoredText,
    Trace,
    check_struct,
    header_session,
    invalid,
    model_id,
    one_of,
    parse_shape,
    text_problem,
)
from server.videos import options
from server.webhooks.targets import check_callback_url

MAX_PROMPT_CHARS = 20_000
MAX_FRAME_IMAGES = 2
MAX_INPUT_REFERENCES = 8
MAX_URL_CHARS = 8 * 1024 * 1024  # data: URLs carry whole images


@dataclass
class VideoInput:
    model: Model
    params: dict[str, Any]  # what the provider gets (no session_id/user/trace)
    duration: int
    callback_url: str | None
    session_id: str | None
    user: str | None
    trace: dict[str, Any] | None
    provider_options: dict[str, Any] = field(default_factory=dict)
    previous_job_id: str | None = None  # checked against the caller's jobs by submit_job


def _allowed(value: str, allowed: tuple[str, ...] | None, param: str, model: Model) -> None:
    if allowed is None:
        raise bad_request(f"{param} is not supported by {model.id}", param=param)
    if value not in allowed:
        raise bad_request(
            f"{param} {value!r} is not supported by {model.id}; allowed: {', '.join(allowed)}",
            param=param,
        )


def _media_url(url: str) -> str:
    if len(url) > MAX_URL_CHARS:
        raise invalid("is too long")
    problem = text_problem(url)
    if problem is not None:
        raise invalid(problem)
    scheme = urlsplit(url).scheme.lower() if "://" in url or url.startswith("data:") else ""
    if scheme not in ("https", "http", "data"):
        raise invalid("must be an http(s) or data: URL")
    return url


def _size(value: str) -> str:
    if options.parse_size(value) is None:
        raise invalid("must be <WIDTH>x<HEIGHT>, e.g. 1280x720")
    return value


class _MediaUrl(Shape):
    url: Annotated[str, Field(min_length=1), AfterValidator(_media_url)]


class _FrameImage(Shape):
    type: one_of(("image_url",))  # type: ignore[valid-type]  # one_of() builds an Annotated[str, ...] at run time
    frame_type: one_of(options.FRAME_TYPES)  # type: ignore[valid-type]  # one_of() builds an Annotated[str, ...] at run time
    image_url: _MediaUrl = Field(default_factory=dict, validate_default=True)


class _InputReference(Shape):
    """A union on `type`: only the member it names is read (and required)."""

    type: one_of(options.REFERENCE_TYPES)  # type: ignore[valid-type]  # one_of() builds an Annotated[str, ...] at run time
    image_url: _MediaUrl | None = None
    audio_url: _MediaUrl | None = None
    video_url: _MediaUrl | None = None

    @model_validator(mode="before")
    @classmethod
    def _named_member(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("type") in options.REFERENCE_TYPES:
            return {"type": data["type"], data["type"]: data.get(data["type"]) or {}}
        return data

    @property
    def url(self) -> str:
        member = getattr(self, self.type)
        assert member is not None
        return str(member.url)


class _VideoShape(Shape):
    """gateway.v1.CreateVideoRequest (POST /videos): what any model accepts."""

    model: Annotated[str, Field(min_length=1), AfterValidator(model_id)]
    prompt: Annotated[StoredText, Field(max_length=MAX_PROMPT_CHARS)] = ""
    resolution: one_of(options.RESOLUTIONS) | None = None  # type: ignore[valid-type]  # one_of() builds an Annotated[str, ...] at run time
    aspect_ratio: one_of(options.ASPECT_RATIOS) | None = None  # type: ignore[valid-type]  # one_of() builds an Annotated[str, ...] at run time
    size: Annotated[str, AfterValidator(_size)] | None = None
    frame_images: list[_FrameImage] = Field([], max_length=MAX_FRAME_IMAGES)
    input_references: list[_InputReference] = Field([], max_length=MAX_INPUT_REFERENCES)
    duration: int | None = Field(None, ge=1)
    generate_audio: bool | None = None
    seed: int | None = None
    creativity: int | None = None
    upscale_factor: float | None = Field(None, gt=0, allow_inf_nan=False)
    callback_url: str | None = None  # checked in full by check_callback_url
    session_id: BoundedId | None = None
    user: BoundedId | None = None
    trace: Trace | None = None
    provider: Provider | None = None
    previous_job_id: BoundedId | None = None


def _dimensions(shape: _VideoShape, caps: VideoCapabilities, model: Model) -> dict[str, Any]:
    resolution, aspect = shape.resolution, shape.aspect_ratio
    if resolution is not None:
        _allowed(resolution, caps.resolutions, "resolution", model)
    if aspect is not None:
        _allowed(aspect, caps.aspect_ratios, "aspect_ratio", model)
    if shape.size is not None:
        size = options.parse_size(shape.size)
        assert size is not None  # the shape's rule
        if caps.sizes is not None:
            _allowed(shape.size, caps.sizes, "size", model)
        width, height = size
        size_resolution = options.resolution_of(width, height)
        size_aspect = options.aspect_of(width, height)
        if caps.sizes is None and (
            size_resolution is None
            or size_aspect is None
            or caps.resolutions is None
            or size_resolution not in caps.resolutions
            or caps.aspect_ratios is None
            or size_aspect not in caps.aspect_ratios
        ):
            raise bad_request(f"size {shape.size} is not supported by {model.id}", param="size")
        if (resolution is not None and resolution != size_resolution) or (
            aspect is not None and aspect != size_aspect
        ):
            raise bad_request(
                "size contradicts resolution/aspect_ratio: give one or make them agree",
                param="size",
            )
        return {
            "width": width,
            "height": height,
            "resolution": size_resolution or resolution,
            "aspect_ratio": size_aspect or aspect,
        }
    resolution = resolution or caps.default_resolution or (caps.resolutions or ("720p",))[0]
    aspect = aspect or caps.default_aspect_ratio or (caps.aspect_ratios or ("16:9",))[0]
    width, height = options.size_of(resolution, aspect)
    return {"width": width, "height": height, "resolution": resolution, "aspect_ratio": aspect}


def _frames(shape: _VideoShape, caps: VideoCapabilities, model: Model) -> list[dict[str, str]]:
    frames = []
    seen: set[str] = set()
    for index, frame in enumerate(shape.frame_images):
        param = f"frame_images[{index}].frame_type"
        _allowed(frame.frame_type, caps.frame_images, param, model)
        if frame.frame_type in seen:
            raise bad_request(f"more than one {frame.frame_type}", param=param)
        seen.add(frame.frame_type)
        frames.append({"frame_type": frame.frame_type, "url": frame.image_url.url})
    return frames


def parse_video_request(
    request: Any, catalog: Catalog, header_session_id: str | None, today: date
) -> VideoInput:
    """Validate a gateway.v1.CreateVideoRequest; every failure is a 400 naming the field:
    its shape first (_VideoShape), then what the model supports."""
    # Before the message becomes a dict, which fails on NaN in a Struct.
    if request.HasField("trace"):
        check_struct(request.trace, "trace")
    if request.HasField("provider") and request.provider.HasField("options"):
        check_struct(request.provider.options, "provider.options")
    fields = json_format.MessageToDict(request, preserving_proto_field_name=True)
    shape = parse_shape(_VideoShape, fields, strict=False)  # int64 arrives as text
    model = catalog.get(shape.model)
    if model is None or model.kind != "video" or model.video is None:
        raise bad_request(f"Unknown video model {shape.model!r}", param="model")
    model.refuse_if_retired(today)
    caps = model.video
    dims = _dimensions(shape, caps, model)
    frames = _frames(shape, caps, model)
    # Audio and video references only go to providers that honour them.
    references = [
        {"type": r.type, "url": r.url}
        for r in shape.input_references
        if r.type in caps.input_reference_types
    ]

    has_images = bool(frames) or any(r["type"] == "image_url" for r in references)
    if not shape.prompt.strip() and not (caps.prompt_optional_with_images and has_images):
        raise bad_request("prompt is required for this model", param="prompt")

    duration = shape.duration if shape.duration is not None else caps.default_duration
    if duration is None:
        duration = (caps.durations or (5,))[0]
    if caps.durations is not None and duration not in caps.durations:
        raise bad_request(
            f"duration {duration} is not supported by {model.id}; allowed: "
            f"{', '.join(map(str, caps.durations))}",
            param="duration",
        )

    generate_audio = (
        shape.generate_audio if shape.generate_audio is not None else bool(caps.generate_audio)
    )
    if generate_audio and not caps.generate_audio:
        raise bad_request(f"{model.id} cannot generate audio", param="generate_audio")

    params: dict[str, Any] = {
        "prompt": shape.prompt,
        "duration": duration,
        "generate_audio": generate_audio,
        "frame_images": frames,
        "input_references": references,
        **dims,
    }
    if shape.seed is not None:
        params["seed"] = shape.seed
    for name in ("creativity", "upscale_factor"):
        value = getattr(shape, name)
        if value is not None:
            if not caps.upscaling:
                raise bad_request(
                    f"{name} is only for video upscaling models; {model.id} generates video",
                    param=name,
                )
            params[name] = value

    callback = check_callback_url(shape.callback_url) if shape.callback_url is not None else None
    session = shape.session_id
    if session is None and header_session_id:
        session = header_session(header_session_id)
    return VideoInput(
        model=model,
        params=params,
        duration=duration,
        callback_url=callback,
        session_id=session,
        user=shape.user,
        trace=fields.get("trace"),
        provider_options=shape.provider.options if shape.provider else {},
        previous_job_id=shape.previous_job_id,
    )
