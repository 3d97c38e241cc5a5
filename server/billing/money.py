"""Money: integer micro-dollars in storage and arithmetic, Decimal at the edges."""

from __future__ import annotations

import re
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


# The one grammar of an amount of USD, wherever one comes in (API, CLI): ASCII digits, then
# optionally one '.' and one to six ASCII digits. Python's Decimal() and int() also take
# signs, surrounding whitespace, '_' between digits, exponents, "NaN"/"Infinity" and the
# digits of every script ("\u0665" is 5); none of that is money here.
AMOUNT_GRAMMAR = re.compile(r"(?P<whole>[0-9]+)(?:\.(?P<fraction>[0-9]{1,6}))?")
_FINER = re.compile(r"[0-9]+\.[0-9]{7,}")
GRAMMAR_REFUSAL = (
    "must be a plain decimal number of USD: ASCII digits, optionally '.' and at most 6 "
    "decimal places (no sign, spaces, '_' or exponent)"
)
_TOO_LARGE = "must be at most 1000000000 USD (1e9)"
_TOO_FINE = "must be a whole number of micro-dollars (at most 6 decimal places)"
_MAX_WHOLE_DIGITS = len(str(int(MAX_USD)))


def parse_usd(text: str) -> int:
    """An amount of USD written by a client or an operator, as exact micro-dollars: the
    grammar above, 0 to 1e9 USD. Anything else is an AmountError saying why (finer than a
    micro-dollar is refused, never rounded)."""
    match = AMOUNT_GRAMMAR.fullmatch(text)
    if match is None:
        raise AmountError(_TOO_FINE if _FINER.fullmatch(text) else GRAMMAR_REFUSAL)
    whole = match["whole"].lstrip("0")
    if len(whole) > _MAX_WHOLE_DIGITS:  # before int(), which refuses thousands of digits
        raise AmountError(_TOO_LARGE)
    fraction = (match["fraction"] or "").ljust(6, "0")
    micros = int(whole or "0") * MICROS_PER_USD + int(fraction)
    if micros > MAX_MICROS:
        raise AmountError(_TOO_LARGE)
    return micros


def exact_micros(amount: Decimal | str | int) -> int:
    """An amount in USD as micro-dollars by `parse_usd`'s grammar: text as written; a number
    (a JSON number, an int) as its plain decimal notation, so a sign, NaN or a seventh
    decimal place is refused the same way."""
    if isinstance(amount, str):
        return parse_usd(amount)
    if isinstance(amount, bool) or not isinstance(amount, Decimal | int):
        raise AmountError(GRAMMAR_REFUSAL)
    value = Decimal(amount)
    if value.is_finite() and value > MAX_USD:  # before writing out every digit of 1e300
        raise AmountError(_TOO_LARGE)
    return parse_usd(format(value, "f"))


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
