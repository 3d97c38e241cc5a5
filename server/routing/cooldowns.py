"""Provider cooldowns: a provider that answered "wait" (429, or 503/529 overloaded, with a
retry hint) is not called again by this process until the hint has passed. Routing skips it
and tries the model's other endpoints; when every usable endpoint is cooling down the request
is refused at once with 503 and a Retry-After of the earliest end, instead of calling
providers that said they would refuse.

Per process and in memory: a hint is short-lived and a second process learns it from its own
first refusal. Keyed by the endpoint and the credential it carries, so a workspace's own key
(BYOK) that is rate limited does not cool the operator's key for the same provider, nor the
other way round."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

from server.clock import Clock
from server.providers.endpoint import Endpoint
from server.providers.failures import OVERLOADED, RATE_LIMITED, ProviderFailure

# A provider's hint is trusted up to this long: a bad header must not take an endpoint out of
# routing for hours.
MAX_COOLDOWN_SECONDS = 300

_Key = tuple[str, str, str | None, str | None, str]


def _key(endpoint: Endpoint) -> _Key:
    # The credential itself is never kept: a digest tells two keys apart.
    credential = endpoint.credential() or ""
    digest = hashlib.sha256(credential.encode()).hexdigest()[:16]
    return (endpoint.provider, endpoint.adapter, endpoint.base_url, endpoint.model, digest)


class Cooldowns:
    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._until: dict[_Key, datetime] = {}

    def note(self, endpoint: Endpoint, failure: ProviderFailure) -> None:
        """Remember a provider's "retry after" for this endpoint and credential."""
        if failure.kind not in (RATE_LIMITED, OVERLOADED) or not failure.retry_after:
            return
        seconds = min(failure.retry_after, MAX_COOLDOWN_SECONDS)
        until = self._clock.now() + timedelta(seconds=seconds)
        key = _key(endpoint)
        self._until[key] = max(until, self._until.get(key, until))

    def remaining(self, endpoint: Endpoint) -> float | None:
        """Seconds until `endpoint` may be called again; None when it may be now."""
        if not self._until:  # nothing cooling (nearly always): no key to digest
            return None
        key = _key(endpoint)
        until = self._until.get(key)
        if until is None:
            return None
        left = (until - self._clock.now()).total_seconds()
        if left <= 0:
            del self._until[key]
            return None
        return left
