"""Fallback routing: try a model's endpoints in order; turn the attempts' failures into the
one error the API reference prescribes."""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from server.errors import GatewayError
from server.observability.metrics import Metrics
from server.providers.endpoint import Endpoint
from server.providers.failures import (
    CLIENT_ERROR,
    OVERLOADED,
    RATE_LIMITED,
    TIMEOUT,
    ProviderFailure,
)
from server.routing.cooldowns import Cooldowns
from server.routing.readiness import endpoints_problem

log = logging.getLogger("gateway.routing")
T = TypeVar("T")


@dataclass(frozen=True)
class Attempt:
    endpoint: Endpoint
    failure: ProviderFailure


@dataclass(frozen=True)
class Routed(Generic[T]):
    value: T
    endpoint: Endpoint
    attempts: tuple[Attempt, ...]  # the failed attempts before the one that served


NO_PROVIDER = "No available provider meets the routing requirements"


def no_provider(model_id: str, endpoints: Sequence[Endpoint]) -> GatewayError:
    """503 for a model none of whose endpoints can be used, naming what the operator must set
    (environment variable names, never their values)."""
    problem = endpoints_problem(endpoints)
    if problem is None:
        return GatewayError(503, NO_PROVIDER)
    return GatewayError(503, f"{NO_PROVIDER}: {model_id} has no configured provider; {problem}")


def all_cooling_down(seconds: float) -> GatewayError:
    """Every usable endpoint asked to wait (server/routing/cooldowns.py): 503, to retry once
    the first of them may be called."""
    return GatewayError(
        503,
        f"{NO_PROVIDER}: every provider for this model asked the gateway to wait",
        retry_after_seconds=max(1, math.ceil(seconds)),
    )


def final_error(
    attempts: Sequence[Attempt], model_id: str = "", endpoints: Sequence[Endpoint] = ()
) -> GatewayError:
    """The error for a request every endpoint failed (or none could be tried)."""
    if not attempts:
        return no_provider(model_id, endpoints)
    last = attempts[-1]
    metadata: dict[str, object] = {"provider_name": last.endpoint.provider}
    if last.failure.provider_code is not None:
        metadata["provider_code"] = last.failure.provider_code
    if all(a.failure.kind == RATE_LIMITED for a in attempts):
        hints = [a.failure.retry_after for a in attempts]
        retry_after = max(h for h in hints if h is not None) if None not in hints else None
        return GatewayError(
            429, "Provider rate limited the request", metadata, retry_after_seconds=retry_after
        )
    if last.failure.kind == RATE_LIMITED:
        return GatewayError(429, "Provider rate limited the request", metadata)
    if last.failure.kind == OVERLOADED:
        return GatewayError(529, "Provider returned error (overloaded)", metadata)
    if last.failure.kind == TIMEOUT:
        return GatewayError(
            504, "Operation aborted due to timeout: the provider did not answer", metadata
        )
    return GatewayError(502, "Provider returned error", metadata)


async def route(
    model_id: str,
    endpoints: Sequence[Endpoint],
    attempt: Callable[[Endpoint], Awaitable[T]],
    metrics: Metrics,
    operation: str,
    cooldowns: Cooldowns | None = None,
) -> Routed[T]:
    """Run `attempt` on each usable endpoint until one succeeds. A failure that is the
    client's fault ends the request at once (another provider would refuse it too). An
    endpoint cooling down (it asked to wait: `cooldowns`) is skipped; when all are, 503 with
    the earliest time to retry."""
    failures: list[Attempt] = []
    cooling: list[float] = []
    for endpoint in endpoints:
        if not endpoint.available:
            continue
        wait = cooldowns.remaining(endpoint) if cooldowns is not None else None
        if wait is not None:
            cooling.append(wait)
            continue
        if failures:  # handed on from the provider that just failed
            metrics.fallbacks.labels(model_id, failures[-1].endpoint.provider).inc()
        try:
            with metrics.provider_call(endpoint.provider, operation):
                value = await attempt(endpoint)
        except ProviderFailure as failure:
            if failure.kind == CLIENT_ERROR:
                metadata: dict[str, str | int] = {"provider_name": endpoint.provider}
                if failure.provider_code is not None:
                    metadata["provider_code"] = failure.provider_code
                raise GatewayError(400, failure.message, metadata) from failure
            log.warning(
                "provider %s failed (%s, status %s); trying the next endpoint",
                endpoint.provider,
                failure.kind,
                failure.status,
            )
            if cooldowns is not None:
                cooldowns.note(endpoint, failure)
            failures.append(Attempt(endpoint, failure))
            continue
        return Routed(value=value, endpoint=endpoint, attempts=tuple(failures))
    if not failures and cooling:
        raise all_cooling_down(min(cooling))
    raise final_error(failures, model_id, endpoints)
