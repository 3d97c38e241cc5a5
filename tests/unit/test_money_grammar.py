"""Issue 29 item 10: every amount of money that comes in (API, CLI) is read by one strict
decimal grammar (server/billing/money.py `parse_usd`), not by Python's Decimal(), which takes
"1_000", "\u0665" (Arabic-Indic five), " 5" and "+5"."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from google.protobuf import struct_pb2
from hypothesis import example, given
from hypothesis import strategies as st

from server.accounts.provisioning import add_workspace_credits, workspace_for_operator
from server.billing.money import MAX_MICROS, AmountError, exact_micros, parse_usd
from server.errors import GatewayError
from server.services.rpc import usd_or_null
from testkit.domain import Domain
from tests.unit.test_cli_commands import Run, _one_clear_line, data, gateway

__all__ = ["data", "gateway"]  # fixtures shared with the CLI's tests
pytestmark = pytest.mark.usefixtures("as_an_operator")

# The language, written independently of the implementation: ASCII digits, optionally one
# '.' followed by one to six ASCII digits. Nothing else.
LANGUAGE = re.compile(r"[0123456789]+(\.[0123456789]{1,6})?")

# Each quirk of Python's number parsing that an amount must not inherit.
QUIRKS = [
    "1_000",  # Decimal() and int() take underscores
    "\u0665",  # ARABIC-INDIC DIGIT FIVE: Decimal() reads 5
    "\uff15",  # FULLWIDTH DIGIT FIVE
    " 5",
    "5 ",
    "5\n",
    "\t5",
    "+5",
    "-5",
    "-0",
    "1e3",
    "1E3",
    "Infinity",
    "NaN",
    ".5",
    "5.",
    "5..0",
    "0x10",
    "",
]


def _reference(text: str) -> int | None:
    """What the grammar says, by other means: micro-dollars, or None for a refusal."""
    if LANGUAGE.fullmatch(text) is None:
        return None
    value = Decimal(text) * 1_000_000
    return int(value) if value <= MAX_MICROS else None


def _parsed(text: str) -> int | None:
    try:
        return parse_usd(text)
    except AmountError:
        return None


amount_like = st.text(alphabet="0123456789._+- e\u0665\uff15\n", max_size=16)


@given(st.one_of(st.text(max_size=20), amount_like, st.from_regex(LANGUAGE, fullmatch=True)))
@example("1000000000")
@example("1000000000.000001")
@example("0000000000001000000000")
@example("0.000001")
def test_the_grammar_accepts_exactly_its_language(text: str) -> None:
    assert _parsed(text) == _reference(text)


@pytest.mark.parametrize("text", QUIRKS)
def test_pythons_quirks_are_refused(text: str) -> None:
    with pytest.raises(AmountError, match="decimal number of USD"):
        parse_usd(text)


@pytest.mark.parametrize(
    ("text", "micros"),
    [("5", 5_000_000), ("0.5", 500_000), ("007", 7_000_000), ("1.000001", 1_000_001)],
)
def test_plain_decimals_are_exact(text: str, micros: int) -> None:
    assert parse_usd(text) == micros


def test_finer_than_a_micro_dollar_and_over_1e9_say_why() -> None:
    with pytest.raises(AmountError, match="micro-dollars"):
        parse_usd("0.0000015")
    with pytest.raises(AmountError, match="1e9"):
        parse_usd("1000000000.000001")
    with pytest.raises(AmountError, match="1e9"):
        parse_usd("9" * 5000)  # more digits than int() converts


@pytest.mark.parametrize(
    ("number", "micros"),
    [(12.5, 12_500_000), (1e-06, 1), (100.0, 100_000_000), (1e9, MAX_MICROS)],
)
def test_json_numbers_are_their_plain_decimal(number: float, micros: int) -> None:
    assert usd_or_null(struct_pb2.Value(number_value=number), "limit") == micros


@pytest.mark.parametrize("number", [-1.0, -0.0, 1e-07, 1e10, 1e300])
def test_json_numbers_outside_the_grammar_are_refused_naming_the_field(number: float) -> None:
    with pytest.raises(GatewayError) as refused:
        usd_or_null(struct_pb2.Value(number_value=number), "limit")
    assert refused.value.status == 400 and refused.value.metadata == {"param": "limit"}


def test_exact_micros_reads_decimals_by_the_same_grammar() -> None:
    assert exact_micros(Decimal("2.5")) == 2_500_000 and exact_micros(3) == 3_000_000
    for refused in (Decimal("-1"), Decimal("NaN"), Decimal("0.0000001")):
        with pytest.raises(AmountError):
            exact_micros(refused)


@pytest.mark.parametrize("text", QUIRKS)
async def test_the_api_refuses_the_quirks_naming_the_field(domain: Domain, text: str) -> None:
    issued = await domain.funded_key(f"quirk-{abs(hash(text)) % 100_000}", usd="0")
    async with domain.sessions() as session:
        workspace = await workspace_for_operator(session, issued.workspace.id)
        with pytest.raises(GatewayError) as refused:
            await add_workspace_credits(session, workspace, text, domain.clock.now(), reference="u")
    assert refused.value.status == 400 and refused.value.metadata == {"param": "amount"}
    assert "decimal number of USD" in refused.value.message


@pytest.mark.parametrize("text", ["1_000", "\u0665", " 5", "+5", "1e3"])
@pytest.mark.parametrize(
    "args",
    [
        ("credits", "add", "--amount"),
        ("keys", "create", "--name", "k", "--limit"),
        ("guardrails", "create", "--name", "g", "--max-cost-per-request"),
        ("guardrails", "create", "--name", "g", "--reset-interval", "daily", "--limit-usd"),
    ],
)
def test_the_cli_refuses_the_quirks_in_one_clear_line(
    gateway: Run, args: tuple[str, ...], text: str
) -> None:
    _one_clear_line(gateway(*args, text), "error", "decimal number of USD")
