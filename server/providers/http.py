"""Talking HTTP to providers over the one pooled client: the credential header, transport
failures, and reading a provider's HTTP failure (status, error code, retry hint)."""

from __future__ import annotations

import email.utils
import ipaddress
import json
import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import httpx

from server.providers.endpoint import Endpoint
from server.providers.failures import (
    CLIENT_ERROR,
    INVALID_RESPONSE,
    OVERLOADED,
    RATE_LIMITED,
    REJECTED_CREDENTIALS,
    SERVER_ERROR,
    TIMEOUT,
    UNREACHABLE,
    ProviderFailure,
)

MAX_PROVIDER_MESSAGE = 300
# What a provider's error body says: its error code and message. Each provider has its own
# shape; the default reads OpenAI's ({"error": {"code", "message"}} or {"error": "..."}).
ErrorFields = tuple[str | int | None, str]
ErrorReader = Callable[[httpx.Response], ErrorFields]


def retry_after_seconds(value: str | None, now: datetime | None = None) -> int | None:
    """Retry-After as whole seconds (delta-seconds or an HTTP date); None when absent/bad."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return int(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    delta = (when - (now or datetime.now(UTC))).total_seconds()
    return max(0, int(delta + 0.999))


def retry_hint(response: httpx.Response) -> int | None:
    """Seconds to wait: Retry-After, or Azure's documented retry-after-ms."""
    seconds = retry_after_seconds(response.headers.get("retry-after"))
    millis = response.headers.get("retry-after-ms", "").strip()
    if seconds is None and millis.isdigit():
        seconds = math.ceil(int(millis) / 1000)
    return seconds


def _error_fields(response: httpx.Response) -> ErrorFields:
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None, ""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        code = error.get("code") or error.get("type")
        message = error.get("message")
        return (
            code if isinstance(code, str | int) else None,
            message if isinstance(message, str) else "",
        )
    if isinstance(error, str):
        return None, error
    return None, ""


def failure_from_response(
    response: httpx.Response, read_error: ErrorReader = _error_fields
) -> ProviderFailure:
    status = response.status_code
    code, message = read_error(response)
    provider_code: str | int = code if code is not None else status
    message = message[:MAX_PROVIDER_MESSAGE]
    if status == 429:
        return ProviderFailure(
            RATE_LIMITED,
            "Provider rate limited the request",
            status=status,
            provider_code=provider_code,
            retry_after=retry_hint(response),
        )
    if status == 529 or (status == 503 and "overload" in message.lower()):
        return ProviderFailure(
            OVERLOADED,
            "Provider is overloaded",
            status=status,
            provider_code=provider_code,
            retry_after=retry_hint(response),
        )
    if status in (401, 403):
        return ProviderFailure(
            REJECTED_CREDENTIALS,
            "Provider refused the gateway's credentials",
            status=status,
            provider_code=provider_code,
        )
    if 400 <= status < 500 and status not in (408, 409, 425):
        detail = f": {message}" if message else ""
        return ProviderFailure(
            CLIENT_ERROR,
            f"Provider rejected the request{detail}",
            status=status,
            provider_code=provider_code,
        )
    return ProviderFailure(
        SERVER_ERROR, "Provider returned error", status=status, provider_code=provider_code
    )


def authorized(
    endpoint: Endpoint, headers: dict[str, str] | None = None, scheme: str = "Bearer"
) -> dict[str, str]:
    """The headers plus the endpoint's credential (read from its environment variable), as
    `Authorization: <scheme> <credential>`."""
    result = dict(headers or {})
    credential = endpoint.credential()
    if credential:
        result["Authorization"] = f"{scheme} {credential}"
    return result


async def send(
    http: httpx.AsyncClient, request: httpx.Request, read_error: ErrorReader = _error_fields
) -> httpx.Response:
    """Send one provider request; transport failures and HTTP errors (their bodies read by
    `read_error`) become ProviderFailures."""
    try:
        response = await http.send(request)
    except httpx.TimeoutException as exc:
        raise ProviderFailure(TIMEOUT, "Provider timed out") from exc
    except httpx.TransportError as exc:
        raise ProviderFailure(UNREACHABLE, "Provider is unreachable") from exc
    if response.status_code >= 400:
        raise failure_from_response(response, read_error)
    return response


async def call(
    http: httpx.AsyncClient,
    endpoint: Endpoint,
    method: str,
    url: str,
    *,
    read_error: ErrorReader = _error_fields,
    auth_scheme: str = "Bearer",
    **kwargs: Any,
) -> httpx.Response:
    request = http.build_request(
        method,
        url,
        headers=authorized(endpoint, kwargs.pop("headers", None), auth_scheme),
        timeout=endpoint.timeout_seconds,
        **kwargs,
    )
    return await send(http, request, read_error)


def downloadable(url: object, base_url: str | None) -> bool:
    """Whether the gateway fetches a file URL from a provider's answer: on the endpoint's own
    origin, or HTTPS to a public host (a CDN, signed storage), never to a loopback, private
    or link-local address the answer names (no requests into the gateway's network)."""
    if not isinstance(url, str):
        return False
    got, base = urlsplit(url), urlsplit(base_url or "")
    if not got.hostname:
        return False
    if (got.scheme, got.netloc) == (base.scheme, base.netloc):
        return True
    if got.scheme != "https" or got.hostname == "localhost":
        return False
    try:
        return ipaddress.ip_address(got.hostname).is_global
    except ValueError:
        return True  # a host name: the provider's CDN or storage


async def download(http: httpx.AsyncClient, endpoint: Endpoint, url: object) -> bytes:
    """A result file a provider pointed at (often a CDN or signed storage URL): fetched
    without the endpoint's credential, which belongs to the provider's API host only."""
    if not isinstance(url, str) or not downloadable(url, endpoint.base_url):
        raise ProviderFailure(INVALID_RESPONSE, "Provider returned a bad video URL")
    request = http.build_request("GET", url, timeout=endpoint.timeout_seconds)
    content = (await send(http, request)).content
    if not content:
        raise ProviderFailure(INVALID_RESPONSE, "Provider returned an empty video")
    return content


def same_origin(url: object, base_url: str) -> bool:
    """Whether a URL from a provider's response lies under the endpoint's base URL (same
    scheme, host and port, below its path): only such URLs are called with the credential."""
    if not isinstance(url, str):
        return False
    got, base = urlsplit(url), urlsplit(base_url)
    prefix = base.path.rstrip("/") + "/"
    return (
        (got.scheme, got.netloc) == (base.scheme, base.netloc)
        and got.path.startswith(prefix)
        and ".." not in got.path.split("/")
        and not got.query
        and not got.fragment
    )


def json_object(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError as exc:
        raise ProviderFailure(INVALID_RESPONSE, "Provider returned an invalid response") from exc
    if not isinstance(body, dict):
        raise ProviderFailure(INVALID_RESPONSE, "Provider returned an invalid response")
    return body
