"""Money: integer micro-dollars in storage and arithmetic, Decimal at the edges."""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation

MICROS_PER_USD = 1_000_000
_ONE_MICRO = Decimal("0.000001")
# The largest amount the gateway takes anywhere (a purchase, a key's limit, a guardrail's
# cost ceiling) and the largest balance an account may reach: 1e9 USD. In micro-dollars that
# is 1e15, far inside int64 and below 2**53, and every amount up to it has at most 15
# significant digits, so the JSON numbers of the API print it exactly.
MAX_USD = Decimal(1_000_000_000)
MAX_MICROS = int(MAX_USD) * MICROS_PER_USD


class AmountError(ValueError):
    """An amount the gateway does not take; the message says why, for the caller."""


def exact_micros(amount: Decimal | str | int) -> int:
    """An amount in USD as micro-dollars, exactly: finite, 0 to 1e9 USD, and no finer than
    a micro-dollar (refused, not rounded: money is never silently changed)."""
    try:
        value = Decimal(amount)
    except (InvalidOperation, TypeError, ValueError) as exc:
        raise AmountError("not an amount of money") from exc
    if not value.is_finite():
        raise AmountError("must be a finite number")
    if value < 0:
        raise AmountError("must be 0 or more")
    if value > MAX_USD:
        raise AmountError("must be at most 1000000000 USD (1e9)")
    micros = value * MICROS_PER_USD
    if micros != micros.to_integral_value():
        raise AmountError("must be a whole number of micro-dollars (at most 6 decimal places)")
    return int(micros)


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
    """The JSON number for an amount (a conversion for printing, not arithmetic). Integer
    true division is correctly rounded, as float() of the exact Decimal quotient is: the
    same float, without a Decimal per amount printed."""
    return micros / MICROS_PER_USD
