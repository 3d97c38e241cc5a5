"""Enforcing a workspace's guardrails on a request, before anything is held or charged.

The guardrails in force for a key are those of its workspace assigned to no key, and those
assigned to it. Every one applies: a model must pass every allow list and no block
list, the endpoints used are those whose provider passes every provider rule, and the cost
and video-duration ceilings are the lowest any guardrail sets. A refusal is 403 with
`metadata.guardrail` naming the rule. Budgets are enforced with the credit hold
(server/limits/guardrail_budgets.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa
from sqlmodel.ext.asyncio.session import AsyncSession

from server.billing.money import micros_to_json_number
from server.db.models import Guardrail, GuardrailKeyAssignment
from server.errors import GatewayError
from server.limits.guardrail_budgets import GuardrailBudget
from server.providers.endpoint import Endpoint
from server.routing.catalog import Model

ALLOWED_MODELS = "allowed_models"
IGNORED_MODELS = "ignored_models"
ALLOWED_PROVIDERS = "allowed_providers"
IGNORED_PROVIDERS = "ignored_providers"
MAX_COST_PER_REQUEST = "max_cost_per_request"
MAX_VIDEO_DURATION = "max_video_duration"

_GUARDRAILS = Guardrail.__table__
_ASSIGNMENTS = GuardrailKeyAssignment.__table__
_ASSIGNED = sa.exists().where(_ASSIGNMENTS.c.guardrail_id == _GUARDRAILS.c.id)
_ASSIGNED_TO_KEY = sa.exists().where(
    _ASSIGNMENTS.c.guardrail_id == _GUARDRAILS.c.id,
    _ASSIGNMENTS.c.key_hash == sa.bindparam("key_hash"),
)
_OF_KEY = (
    sa.select(Guardrail, _ASSIGNED_TO_KEY.label("assigned"))
    .where(
        _GUARDRAILS.c.workspace_id == sa.bindparam("workspace_id"),
        sa.or_(~_ASSIGNED, _ASSIGNED_TO_KEY),
    )
    .order_by(_GUARDRAILS.c.created_at, _GUARDRAILS.c.id)
)


def blocked(guardrail: Guardrail, rule: str, message: str) -> GatewayError:
    return GatewayError(
        403,
        f"Blocked by guardrail {guardrail.name!r}: {message}",
        {"guardrail": rule, "guardrail_id": guardrail.id, "guardrail_name": guardrail.name},
    )


def _model_refusal(guardrail: Guardrail, model_id: str) -> GatewayError | None:
    if guardrail.allowed_models is not None and model_id not in guardrail.allowed_models:
        return blocked(guardrail, ALLOWED_MODELS, f"model {model_id} is not allowed")
    if guardrail.ignored_models and model_id in guardrail.ignored_models:
        return blocked(guardrail, IGNORED_MODELS, f"model {model_id} is excluded")
    return None


def _provider_refusal(guardrail: Guardrail, provider: str) -> str | None:
    """The rule that refuses `provider`, if one does."""
    if guardrail.allowed_providers is not None and provider not in guardrail.allowed_providers:
        return ALLOWED_PROVIDERS
    if guardrail.ignored_providers and provider in guardrail.ignored_providers:
        return IGNORED_PROVIDERS
    return None


@dataclass(frozen=True)
class Guardrails:
    """The guardrails in force for one key."""

    rules: tuple[Guardrail, ...] = ()
    assigned: frozenset[str] = frozenset()  # ids of the rules assigned to the key itself

    @property
    def budgets(self) -> tuple[GuardrailBudget, ...]:
        return tuple(
            GuardrailBudget(
                guardrail_id=g.id,
                name=g.name,
                limit_micros=g.limit_micros,
                reset_interval=g.reset_interval,
                include_byok=g.include_byok_in_budgets,
                assigned=g.id in self.assigned,
            )
            for g in self.rules
            if g.limit_micros is not None and g.reset_interval is not None
        )

    def endpoints(self, model: Model) -> tuple[Endpoint, ...]:
        """The model's endpoints every guardrail allows, in fallback order; 403 when the
        model itself, or every one of its providers, is refused."""
        for guardrail in self.rules:
            refusal = _model_refusal(guardrail, model.id)
            if refusal is not None:
                raise refusal
        usable = tuple(
            e
            for e in model.endpoints
            if all(_provider_refusal(g, e.provider) is None for g in self.rules)
        )
        if usable or not model.endpoints:
            return usable
        # Name the first guardrail that refuses the model's first provider.
        for guardrail in self.rules:
            rule = _provider_refusal(guardrail, model.endpoints[0].provider)
            if rule is not None:
                providers = ", ".join(sorted({e.provider for e in model.endpoints}))
                raise blocked(
                    guardrail, rule, f"no allowed provider serves {model.id} ({providers})"
                )
        raise AssertionError("a refused endpoint without a refusing guardrail")

    def allows(self, model: Model) -> bool:
        """Whether the model may be used at all (listings show only these)."""
        try:
            self.endpoints(model)
        except GatewayError:
            return False
        return True

    def check_cost(self, estimate_micros: int) -> None:
        self._check_ceiling(
            MAX_COST_PER_REQUEST,
            lambda g: g.max_cost_per_request_micros,
            estimate_micros,
            lambda ceiling: (
                f"the request would cost {micros_to_json_number(estimate_micros)} "
                f"USD, over the {micros_to_json_number(ceiling)} USD per request allowed"
            ),
        )

    def check_video_duration(self, seconds: int) -> None:
        self._check_ceiling(
            MAX_VIDEO_DURATION,
            lambda g: g.max_video_duration_seconds,
            seconds,
            lambda ceiling: f"a {seconds} s video is longer than the {ceiling} s allowed",
        )

    def _check_ceiling(
        self,
        rule: str,
        ceiling_of: Callable[[Guardrail], int | None],
        value: int,
        refusal: Callable[[int], str],
    ) -> None:
        """Refuse `value` over the first guardrail's ceiling it exceeds (`rule` names it)."""
        for guardrail in self.rules:
            ceiling = ceiling_of(guardrail)
            if ceiling is not None and value > ceiling:
                raise blocked(guardrail, rule, refusal(ceiling))


async def guardrails_of(session: AsyncSession, workspace_id: str, key_hash: str) -> Guardrails:
    """The guardrails in force for the key: its workspace's unassigned ones and its own."""
    rows = (
        await session.exec(  # type: ignore[call-overload]  # sqlmodel's exec() is typed for its own select() only
            _OF_KEY, params={"workspace_id": workspace_id, "key_hash": key_hash}
        )
    ).all()
    return Guardrails(tuple(row[0] for row in rows), frozenset(row[0].id for row in rows if row[1]))
