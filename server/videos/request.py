"""POST /videos: every field of the API reference validated against the model's
capabilities into the parameters a provider gets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from google.protobuf import json_format

from server.errors import bad_request
from server.routing.catalog import Catalog, Model, VideoCapabilities
from server.transcription.request import MAX_ID_CHARS, MODEL_ID, TRACE_STRING_KEYS
from server.validation import check_struct, check_text
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


def _allowed(value: str, allowed: tuple[str, ...] | None, param: str, model: Model) -> None:
    if allowed is None:
        raise bad_request(f"{param} is not supported by {model.id}", param=param)
    if value not in allowed:
        raise bad_request(
            f"{param} {value!r} is not supported by {model.id}; allowed: {', '.join(allowed)}",
            param=param,
        )


def _enum(value: str, allowed: tuple[str, ...], param: str) -> None:
    if value not in allowed:
        raise bad_request(
            f"{param} must be one of {', '.join(allowed)}", param=param, allowed=list(allowed)
        )


def _media_url(url: str, param: str) -> str:
    if not url:
        raise bad_request(f"{param} is required", param=param)
    if len(url) > MAX_URL_CHARS:
        raise bad_request(f"{param} is too long", param=param)
    check_text(url, param)
    scheme = urlsplit(url).scheme.lower() if "://" in url or url.startswith("data:") else ""
    if scheme not in ("https", "http", "data"):
        raise bad_request(f"{param} must be an http(s) or data: URL", param=param)
    return url


def _dimensions(request: Any, caps: VideoCapabilities, model: Model) -> dict[str, Any]:
    resolution = request.resolution if request.HasField("resolution") else None
    aspect = request.aspect_ratio if request.HasField("aspect_ratio") else None
    if resolution is not None:
        _enum(resolution, options.RESOLUTIONS, "resolution")
        _allowed(resolution, caps.resolutions, "resolution", model)
    if aspect is not None:
        _enum(aspect, options.ASPECT_RATIOS, "aspect_ratio")
        _allowed(aspect, caps.aspect_ratios, "aspect_ratio", model)
    if request.HasField("size"):
        size = options.parse_size(request.size)
        if size is None:
            raise bad_request("size must be <WIDTH>x<HEIGHT>, e.g. 1280x720", param="size")
        if caps.sizes is not None:
            _allowed(request.size, caps.sizes, "size", model)
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
            raise bad_request(f"size {request.size} is not supported by {model.id}", param="size")
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


def _frames(request: Any, caps: VideoCapabilities, model: Model) -> list[dict[str, str]]:
    frames = []
    seen: set[str] = set()
    if len(request.frame_images) > MAX_FRAME_IMAGES:
        raise bad_request(f"at most {MAX_FRAME_IMAGES} frame_images", param="frame_images")
    for index, frame in enumerate(request.frame_images):
        param = f"frame_images[{index}]"
        if frame.type != "image_url":
            raise bad_request(f"{param}.type must be image_url", param=f"{param}.type")
        _enum(frame.frame_type, options.FRAME_TYPES, f"{param}.frame_type")
        _allowed(frame.frame_type, caps.frame_images, f"{param}.frame_type", model)
        if frame.frame_type in seen:
            raise bad_request(f"more than one {frame.frame_type}", param=f"{param}.frame_type")
        seen.add(frame.frame_type)
        url = _media_url(frame.image_url.url, f"{param}.image_url.url")
        frames.append({"frame_type": frame.frame_type, "url": url})
    return frames


def _references(request: Any, caps: VideoCapabilities) -> list[dict[str, str]]:
    if len(request.input_references) > MAX_INPUT_REFERENCES:
        raise bad_request(
            f"at most {MAX_INPUT_REFERENCES} input_references", param="input_references"
        )
    kept = []
    for index, reference in enumerate(request.input_references):
        param = f"input_references[{index}]"
        _enum(reference.type, options.REFERENCE_TYPES, f"{param}.type")
        member = getattr(reference, reference.type)
        url = _media_url(member.url, f"{param}.{reference.type}.url")
        # Audio and video references only go to providers that honour them.
        if reference.type in caps.input_reference_types:
            kept.append({"type": reference.type, "url": url})
    return kept


def parse_video_request(
    request: Any, catalog: Catalog, header_session_id: str | None
) -> VideoInput:
    """Validate a gateway.v1.CreateVideoRequest; every failure is a 400 naming the field."""
    if not request.model:
        raise bad_request("model is required", param="model")
    if not MODEL_ID.match(request.model):
        raise bad_request("model must look like <provider_prefix>/<model_name>", param="model")
    model = catalog.get(request.model)
    if model is None or model.kind != "video" or model.video is None:
        raise bad_request(f"Unknown video model {request.model!r}", param="model")
    caps = model.video
    dims = _dimensions(request, caps, model)
    frames = _frames(request, caps, model)
    references = _references(request, caps)

    prompt = request.prompt if request.HasField("prompt") else ""
    has_images = bool(frames) or any(r["type"] == "image_url" for r in references)
    if not prompt.strip() and not (caps.prompt_optional_with_images and has_images):
        raise bad_request("prompt is required for this model", param="prompt")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise bad_request(f"prompt must be at most {MAX_PROMPT_CHARS} characters", param="prompt")
    check_text(prompt, "prompt")

    duration = request.duration if request.HasField("duration") else caps.default_duration
    if duration is None:
        duration = (caps.durations or (5,))[0]
    if duration < 1:
        raise bad_request("duration must be at least 1", param="duration")
    if caps.durations is not None and duration not in caps.durations:
        raise bad_request(
            f"duration {duration} is not supported by {model.id}; allowed: "
            f"{', '.join(map(str, caps.durations))}",
            param="duration",
        )

    generate_audio = (
        request.generate_audio if request.HasField("generate_audio") else bool(caps.generate_audio)
    )
    if generate_audio and not caps.generate_audio:
        raise bad_request(f"{model.id} cannot generate audio", param="generate_audio")

    params: dict[str, Any] = {
        "prompt": prompt,
        "duration": duration,
        "generate_audio": generate_audio,
        "frame_images": frames,
        "input_references": references,
        **dims,
    }
    if request.HasField("seed"):
        params["seed"] = request.seed
    for name in ("creativity", "upscale_factor"):
        if request.HasField(name):
            if not caps.upscaling:
                raise bad_request(
                    f"{name} is only for video upscaling models; {model.id} generates video",
                    param=name,
                )
            params[name] = getattr(request, name)
    if "upscale_factor" in params and not params["upscale_factor"] > 0:
        raise bad_request("upscale_factor must be greater than 0", param="upscale_factor")

    callback = (
        check_callback_url(request.callback_url) if request.HasField("callback_url") else None
    )
    session = request.session_id if request.HasField("session_id") else None
    if session is None and header_session_id:
        session = header_session_id
    session_param = "session_id" if request.HasField("session_id") else "x-session-id"
    for name, value in ((session_param, session), ("user", request.user or None)):
        if value is not None and len(value) > MAX_ID_CHARS:
            raise bad_request(f"{name} must be at most {MAX_ID_CHARS} characters", param=name)
        if value is not None:
            check_text(value, name)  # stored with the job and its generation record
    if request.HasField("trace"):
        check_struct(request.trace, "trace")  # before MessageToDict, which fails on NaN
    trace = json_format.MessageToDict(request.trace) if request.HasField("trace") else None
    for key in TRACE_STRING_KEYS:
        if trace is not None and key in trace and not isinstance(trace[key], str):
            raise bad_request(f"trace.{key} must be a string", param=f"trace.{key}")
    provider_options: dict[str, Any] = {}
    if request.HasField("provider") and request.provider.HasField("options"):
        check_struct(request.provider.options, "provider.options")
        provider_options = json_format.MessageToDict(request.provider.options)
        if not all(isinstance(v, dict) for v in provider_options.values()):
            raise bad_request(
                "provider.options must map provider slugs to objects", param="provider.options"
            )
    return VideoInput(
        model=model,
        params=params,
        duration=duration,
        callback_url=callback,
        session_id=session,
        user=request.user if request.HasField("user") else None,
        trace=trace,
        provider_options=provider_options,
    )
