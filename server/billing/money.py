"""Money: integer micro-dollars in storage and arithmetic, Decimal at the edges."""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation

MICROS_PER_USD = 1_000_000
_ONE_MICRO = Decimal("0.000001")


def usd_to_micros(amount: Decimal | str | int) -> int:
    """Exact conversion; amounts finer than a micro-dollar are rounded half-even."""
    try:
        value = Decimal(amount)
    except (InvalidOperation, TypeError, ValueError) as exc:
        raise ValueError(f"not an amount of money: {amount!r}") from exc
    if not value.is_finite():
        raise ValueError("amount must be finite")
    return int(value.quantize(_ONE_MICRO, rounding=ROUND_HALF_EVEN) * MICROS_PER_USD)


def micros_to_usd(micros: int) -> Decimal:
    return Decimal(micros) / MICROS_PER_USD


def micros_to_json_number(micros: int) -> float:
    """The JSON number for an amount (a conversion for printing, not arithmetic)."""
    return float(micros_to_usd(micros))
