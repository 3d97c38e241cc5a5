"""How any provider adapter (speech-to-text or video) tells a failure: its kind, in the words of
the routing rules (server/routing/fallback.py), and what the provider said."""

from __future__ import annotations

# Failure kinds, in the words of the routing rules.
RATE_LIMITED = "rate_limited"
OVERLOADED = "overloaded"
SERVER_ERROR = "server_error"
TIMEOUT = "timeout"
UNREACHABLE = "unreachable"
INVALID_RESPONSE = "invalid_response"
REJECTED_CREDENTIALS = "rejected_credentials"
CLIENT_ERROR = "client_error"  # the request itself is wrong: not retried elsewhere


class ProviderFailure(Exception):
    def __init__(
        self,
        kind: str,
        message: str,
        *,
        status: int | None = None,
        provider_code: str | int | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.provider_code = provider_code
        self.retry_after = retry_after
