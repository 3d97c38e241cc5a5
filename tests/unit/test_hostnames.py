"""Issue 29 item 8 in-process: the one grammar of a valid authority (server/hostnames.py
VALID_AUTHORITY), as the server reads it (`host_of`, the vault's regional-host rule) and as
Envoy is configured to enforce it (the skip predicate of the `gateway.valid_host` filter,
evaluated by tests/unit/test_facade_skips.py's interpreter); end to end:
tests/test_regional_hosts.py."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from facade.envoy_config import INVALID_HOST_LUA, INVALID_HOST_MESSAGE
from server.auth import Principal
from server.errors import GatewayError
from server.hostnames import VALID_AUTHORITY, InvalidHost, host_of
from server.vault.access import vault_scope
from testkit.domain import Domain
from tests.unit.test_facade_skips import PLAIN, _filters, _holds, _skip_predicate

INVALID = [
    "eu.localhost..",
    "eu.localhost%2e",
    "[eu.localhost]",
    "eu.localhost\\",
    "eu..localhost",
    ".eu.localhost",
    "eu.localhost:",
    "eu.localhost:8080:1",
    "eu.localhost:99999",
    "eu.localhost:0",
    "eu.localhost:080",
    "-eu.localhost",
    "eu-.localhost",
    "user@eu.localhost",
    "eu_x.localhost",
    "eu.localhost ",
    " eu.localhost",
    "eu.localhost\t",
    "b\u00fccher.example",
    "[::1",
    "[::1]x",
    "[::1]:",
]
VALID = {
    "eu.localhost": "eu.localhost",
    "EU.Localhost": "eu.localhost",
    "eu.localhost.": "eu.localhost",
    "EU.localhost.:8080": "eu.localhost",
    "eu.localhost:65535": "eu.localhost",
    "127.0.0.1:1": "127.0.0.1",
    "[::1]": "[::1]",
    "[::FFFF:127.0.0.1]:443": "[::ffff:127.0.0.1]",
    "xn--bcher-kva.example": "xn--bcher-kva.example",
}


@pytest.mark.parametrize("authority", INVALID)
def test_an_invalid_authority_is_never_read_as_a_host(authority: str) -> None:
    with pytest.raises(InvalidHost):
        host_of(authority)


@pytest.mark.parametrize(("authority", "host"), VALID.items())
def test_a_valid_authority_is_its_host_as_dns_compares(authority: str, host: str) -> None:
    assert host_of(authority) == host


def test_no_authority_is_no_host() -> None:
    assert host_of(None) is None and host_of("") is None


@given(st.text(alphabet="aZ09-._:[]%@\\ \u00fc", max_size=24))
def test_host_of_refuses_exactly_what_the_grammar_refuses(authority: str) -> None:
    """What the server reads agrees with what Envoy lets through (one root dot aside)."""
    stripped = re.sub(r"\.(?=(:[0-9]*)?$)", "", authority, count=1)
    valid = not authority.startswith("[") and re.fullmatch(VALID_AUTHORITY, stripped)
    valid = valid or (authority.startswith("[") and re.fullmatch(VALID_AUTHORITY, authority))
    try:
        host_of(authority)
    except InvalidHost:
        assert not valid or authority == ""
    else:
        assert valid or authority == ""


@pytest.mark.parametrize("authority", [a for a in INVALID if not a.endswith("..")])
def test_envoy_runs_the_refusal_for_an_invalid_host(authority: str) -> None:
    request = {**PLAIN, ":authority": authority}
    assert not _holds(_skip_predicate("gateway.valid_host"), request, None)


@pytest.mark.parametrize("authority", ["eu.localhost", "127.0.0.1:8080", "[::1]", "gw"])
def test_envoy_skips_the_refusal_for_a_valid_host(authority: str) -> None:
    request = {**PLAIN, ":authority": authority}
    assert _holds(_skip_predicate("gateway.valid_host"), request, None)


def test_envoy_normalises_the_authority_once_and_takes_no_absolute_form() -> None:
    from tests.unit.test_facade_skips import _manager

    manager = _manager()
    assert manager["strip_trailing_host_dot"] is True
    assert manager["strip_matching_host_port"] is True
    assert manager["http_protocol_options"] == {"allow_absolute_url": False}
    lua = _filters()["gateway.valid_host"]["extension_config"]["typed_config"]
    assert lua["default_source_code"]["inline_string"] == INVALID_HOST_LUA
    assert INVALID_HOST_MESSAGE in INVALID_HOST_LUA


async def test_the_vault_refuses_an_invalid_authority_from_a_direct_caller(
    domain: Domain,
) -> None:
    issued = await domain.funded_key("hosts")
    principal: Principal = await domain.principal(issued)
    async with domain.sessions() as session:
        with pytest.raises(GatewayError) as refused:
            await vault_scope(
                session,
                principal,
                None,
                authority="eu.localhost..",
                regional_hosts=frozenset({"eu.localhost"}),
                write=False,
            )
    assert refused.value.status == 400 and "Host" in refused.value.message
