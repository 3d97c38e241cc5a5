"""What the task-style video adapters (gemini, vertex, kling, minimax) share: sending with a
provider's own failure mapping, reading image inputs, and downloading the finished MP4."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_to_bytes, urlsplit

import httpx

from server.providers.failures import (
    CLIENT_ERROR,
    INVALID_RESPONSE,
    TIMEOUT,
    UNREACHABLE,
    ProviderFailure,
)
from server.providers.http import failure_from_response
from server.webhooks.targets import RefusedTarget, UnresolvedTarget, resolve_target

MAX_MESSAGE = 300  # a provider's message, as far as it is repeated
# provider.options never set where the provider calls back (the gateway polls).
UNFORWARDED_OPTIONS = frozenset({"callback_url", "callbackUrl", "webhook_url"})


def merged(body: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """The body with a client's provider.options added. What the gateway mapped from the
    request wins (the model, duration and size it charges for), and no callback URL."""
    extra = {k: v for k, v in options.items() if k not in UNFORWARDED_OPTIONS}
    return {**extra, **{k: v for k, v in body.items() if v is not None}}


async def send(
    http: httpx.AsyncClient,
    request: httpx.Request,
    failure_of: Callable[[httpx.Response], ProviderFailure] = failure_from_response,
) -> httpx.Response:
    """Send one request; transport failures and HTTP errors (read by the provider's own
    `failure_of`) become ProviderFailures."""
    try:
        response = await http.send(request)
    except httpx.TimeoutException as exc:
        raise ProviderFailure(TIMEOUT, "Provider timed out") from exc
    except httpx.TransportError as exc:
        raise ProviderFailure(UNREACHABLE, "Provider is unreachable") from exc
    if response.status_code >= 400:
        raise failure_of(response)
    return response


def json_body(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError as exc:
        raise ProviderFailure(INVALID_RESPONSE, "Provider returned an invalid response") from exc
    if not isinstance(body, dict):
        raise ProviderFailure(INVALID_RESPONSE, "Provider returned an invalid response")
    return body


def json_or_none(response: httpx.Response) -> dict[str, Any] | None:
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def http_url(url: object) -> str:
    """A URL a provider returned for a file, checked to be http(s)."""
    if not isinstance(url, str) or urlsplit(url).scheme not in ("https", "http"):
        raise ProviderFailure(INVALID_RESPONSE, "Provider returned a bad video URL")
    return url


async def download(
    http: httpx.AsyncClient,
    url: str,
    timeout_seconds: float,
    headers: dict[str, str] | None = None,
    failure_of: Callable[[httpx.Response], ProviderFailure] = failure_from_response,
) -> bytes:
    """GET a finished video. `headers` (a credential) go to `url` only: a redirect is
    followed once, without them (the file lives on a storage host)."""
    request = http.build_request(
        "GET", http_url(url), headers=headers or {}, timeout=timeout_seconds
    )
    response = await send(http, request, failure_of)
    if response.is_redirect:
        target = response.headers.get("location")
        if not target:
            raise ProviderFailure(INVALID_RESPONSE, "Provider redirected nowhere")
        follow = http.build_request(
            "GET", http_url(str(response.url.join(target))), timeout=timeout_seconds
        )
        response = await send(http, follow, failure_of)
        if response.is_redirect:
            raise ProviderFailure(INVALID_RESPONSE, "Provider redirected too often")
    if not response.content:
        raise ProviderFailure(INVALID_RESPONSE, "Provider returned an empty video")
    return response.content


@dataclass(frozen=True)
class InlineImage:
    data: bytes
    mime_type: str

    @property
    def base64(self) -> str:
        return base64.b64encode(self.data).decode("ascii")


def data_url_image(url: str) -> InlineImage | None:
    """The image a `data:` URL carries; None for an http(s) URL. A malformed data: URL is
    the client's fault."""
    if not url.startswith("data:"):
        return None
    header, sep, payload = url[5:].partition(",")
    if not sep:
        raise ProviderFailure(CLIENT_ERROR, "An image data: URL has no data")
    parts = header.split(";")
    mime_type = parts[0] or "image/png"
    try:
        if "base64" in parts[1:]:
            data = base64.b64decode(payload, validate=True)
        else:
            data = unquote_to_bytes(payload)
    except (binascii.Error, ValueError) as exc:
        raise ProviderFailure(CLIENT_ERROR, "An image data: URL is not valid base64") from exc
    if not mime_type.startswith("image/") or not data:
        raise ProviderFailure(CLIENT_ERROR, "An image data: URL does not hold an image")
    return InlineImage(data, mime_type)


def image_urls(params: dict[str, Any]) -> tuple[str | None, str | None, list[str]]:
    """(first frame, last frame, image references) of validated request parameters; audio
    and video references are left out (these providers take images only)."""
    frames = {f["frame_type"]: f["url"] for f in params.get("frame_images", [])}
    references = [
        r["url"] for r in params.get("input_references", []) if r.get("type") == "image_url"
    ]
    return frames.get("first_frame"), frames.get("last_frame"), references


def seconds_of(value: object) -> float | None:
    """A provider's reported duration ("5.04" or 5.04), when it is a positive number."""
    try:
        seconds = float(value) if isinstance(value, str | int | float) else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 < seconds < 86_400 else None


MAX_IMAGE_BYTES = 20 * 1024 * 1024  # Veo's own limit on an inline image


class ImageFetcher:
    """Fetches a client's image URL for providers that take images only inline (Veo).
    https only, to public addresses only (checked after DNS and pinned, as webhook targets
    are, so a name cannot point inside the gateway's network), no redirects, no
    credentials, at most MAX_IMAGE_BYTES of an image/* type. Every refusal is the client's
    fault: its message names the problem, never the URL."""

    def __init__(self, http: httpx.AsyncClient, *, allow_private: bool = False) -> None:
        self._http = http
        self._allow_private = allow_private

    async def inline(self, url: str, timeout_seconds: float) -> InlineImage:
        image = data_url_image(url)
        if image is not None:
            return image
        try:
            target = await resolve_target(url, allow_private=self._allow_private)
        except RefusedTarget as exc:
            raise ProviderFailure(
                CLIENT_ERROR, "An image URL must be a public https:// URL or a data: URL"
            ) from exc
        except UnresolvedTarget as exc:
            raise ProviderFailure(CLIENT_ERROR, "An image URL's host cannot be resolved") from exc
        try:
            async with self._http.stream(
                "GET",
                target.url,
                headers={"host": target.host_header, "accept": "image/*"},
                timeout=timeout_seconds,
                extensions={"sni_hostname": target.sni_hostname},
            ) as response:
                mime_type = response.headers.get("content-type", "").split(";")[0].strip()
                if response.status_code != 200 or not mime_type.startswith("image/"):
                    raise ProviderFailure(CLIENT_ERROR, "An image URL did not return an image")
                data = bytearray()
                async for chunk in response.aiter_bytes():
                    data += chunk
                    if len(data) > MAX_IMAGE_BYTES:
                        raise ProviderFailure(CLIENT_ERROR, "An image is larger than 20 MB")
        except httpx.HTTPError as exc:
            raise ProviderFailure(CLIENT_ERROR, "An image URL could not be fetched") from exc
        if not data:
            raise ProviderFailure(CLIENT_ERROR, "An image URL returned no data")
        return InlineImage(bytes(data), mime_type)
