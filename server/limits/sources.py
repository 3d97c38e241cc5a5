"""Every `metadata.limit_source` the gateway answers, named as OpenRouter names them. The
402s of credit holds are decided in server/billing/holds.py (below this layer) and defined
there; the guardrail budget's 403 is defined here."""

from __future__ import annotations

from server.billing.holds import CREDITS, IN_FLIGHT_BUDGET, KEY_LIMIT

GUARDRAIL_BUDGET = "openrouter_guardrail_budget"  # a guardrail's spend limit (403)

__all__ = ["CREDITS", "GUARDRAIL_BUDGET", "IN_FLIGHT_BUDGET", "KEY_LIMIT"]
