"""Reading a provider's HTTP failure: its status, error code and retry hint."""

from __future__ import annotations

import email.utils
import json
from datetime import UTC, datetime

import httpx

from server.providers.stt import (
    CLIENT_ERROR,
    OVERLOADED,
    RATE_LIMITED,
    REJECTED_CREDENTIALS,
    SERVER_ERROR,
    ProviderFailure,
)

MAX_PROVIDER_MESSAGE = 300


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


def _error_fields(response: httpx.Response) -> tuple[str | int | None, str]:
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


def failure_from_response(response: httpx.Response) -> ProviderFailure:
    status = response.status_code
    code, message = _error_fields(response)
    provider_code: str | int = code if code is not None else status
    message = message[:MAX_PROVIDER_MESSAGE]
    if status == 429:
        return ProviderFailure(
            RATE_LIMITED,
            "Provider rate limited the request",
            status=status,
            provider_code=provider_code,
            retry_after=retry_after_seconds(response.headers.get("retry-after")),
        )
    if status == 529 or (status == 503 and "overload" in message.lower()):
        return ProviderFailure(
            OVERLOADED,
            "Provider is overloaded",
            status=status,
            provider_code=provider_code,
            retry_after=retry_after_seconds(response.headers.get("retry-after")),
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
