"""Which catalog models can be routed to on this gateway, and what the operator must set for
the others: environment variable names only, never their values."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date

from server.providers.endpoint import Endpoint
from server.routing.catalog import Catalog, Model


def endpoint_problem(endpoint: Endpoint) -> str | None:
    """Why routing skips this endpoint ("missing GEMINI_API_KEY"); None: it is routable."""
    missing = endpoint.missing_credentials()
    return f"missing {' and '.join(missing)}" if missing else None


def model_problem(model: Model, today: date) -> str | None:
    """Why the model cannot be served (retired, or no endpoint routable); None: it can."""
    return model.retirement(today) or endpoints_problem(model.endpoints)


def endpoints_problem(endpoints: Sequence[Endpoint]) -> str | None:
    """Why none of these endpoints can be used ("the operator must set GEMINI_API_KEY or
    GOOGLE_APPLICATION_CREDENTIALS"); None: one can, or none needs a credential."""
    if not endpoints or any(endpoint.available for endpoint in endpoints):
        return None
    needs: list[str] = []
    for endpoint in endpoints:
        need = " and ".join(endpoint.missing_credentials())
        if need and need not in needs:
            needs.append(need)
    return "the operator must set " + " or ".join(needs)


def report(catalog: Catalog, today: date) -> list[str]:
    """`gateway models`: each model, its endpoints in fallback order (provider, adapter, base
    URL, credential variables) and whether each is routable, and why not (a retired model is
    not, whatever its credentials)."""
    lines: list[str] = []
    for model in sorted(catalog.models.values(), key=lambda m: m.id):
        problem = model_problem(model, today)
        state = "routable" if problem is None else f"not routable: {problem}"
        origin = "built-in" if model.built_in else "operator"
        lines.append(
            f"{model.id}  ({model.kind}, {model.price_per_second} USD/s, {origin})  {state}"
        )
        for index, endpoint in enumerate(model.endpoints, 1):
            variables = [v for v in (endpoint.api_key_env, endpoint.secret_key_env) if v]
            why = endpoint_problem(endpoint)
            lines.append(
                f"  {index}. provider {endpoint.provider}  adapter {endpoint.adapter}"
                f"  {endpoint.base_url or '(in process)'}"
                f"  credentials {', '.join(variables) or '(none)'}"
                f"  {'routable' if why is None else 'not routable: ' + why}"
            )
    return lines
