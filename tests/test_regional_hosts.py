"""Issue 29 item 8, end to end through Envoy with raw sockets: the regional-host refusal of
the vault (GATEWAY_REGIONAL_HOSTS; the stack's are eu.localhost and eu.gateway.test) cannot
be bypassed by a Host DNS would not read as written. Envoy normalises the authority once
(a trailing dot, the port) and refuses a Host that is not a valid host with 400 in the
documented error shape; an absolute-form request is routed on, and the server sees, one
authority; the server compares the host as DNS does (server/hostnames.py)."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from testkit.admin import IssuedKey
from tests.conftest import Stack
from tests.support.raw_http import RawResponse, exchange


@pytest.fixture
async def vault_key(stack: Stack, unique: str) -> IssuedKey:
    workspace = await stack.admin.workspace(f"regional-{unique}", intern_programme=True)
    return await stack.admin.key(workspace, "vault")


def _port(stack: Stack) -> int:
    port = urlsplit(stack.base_url).port
    assert port is not None
    return port


def _get(
    stack: Stack, key: IssuedKey, host: str, target: str = "/api/v1/vault/secrets"
) -> RawResponse:
    request = (
        f"GET {target} HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {key.key}\r\nConnection: close\r\n\r\n"
    )
    return exchange(_port(stack), request.encode("latin-1"), timeout=15)


def _error(response: RawResponse, status: int) -> dict[str, object]:
    assert response.status == status, (response.status, response.body[:300])
    body = response.json()
    assert set(body) == {"error"} and body["error"]["code"] == status, body
    return body["error"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "host",
    [
        "eu.localhost..",  # two root dots: no DNS name
        "eu.localhost%2e",  # percent-encoding has no place in a host
        "[eu.localhost]",  # brackets hold IPv6 literals only
        "eu.localhost\\",
        "eu..localhost",
        "eu.localhost:",  # an empty port
        "eu.localhost:8080:1",
        "eu.localhost:99999",
        "eu.localhost:0",
        "-eu.localhost",
        "user@eu.localhost",
        "",
    ],
)
async def test_an_invalid_host_is_refused_at_the_edge(
    stack: Stack, vault_key: IssuedKey, host: str
) -> None:
    error = _error(_get(stack, vault_key, host), 400)
    # Envoy's HTTP/1 parser refuses a few characters itself (its own words); the rest are
    # refused by the valid-host rule, naming the Host header.
    assert "Host" in str(error["message"]) or error["message"] == "Bad Request"


@pytest.mark.parametrize(
    "host",
    [
        "eu.localhost",
        "eu.localhost.",
        "EU.Localhost.:8080",
        "eu.gateway.test:443",
    ],
)
async def test_a_regional_host_however_written_is_refused_on_the_vault(
    stack: Stack, vault_key: IssuedKey, host: str
) -> None:
    _error(_get(stack, vault_key, host), 403)


@pytest.mark.parametrize(
    "target",
    [
        "http://127.0.0.1/api/v1/vault/secrets",  # Host says eu.localhost
        "http://eu.localhost/api/v1/vault/secrets",
        "https://127.0.0.1:8080/api/v1/key",
    ],
)
async def test_an_absolute_form_target_is_refused(
    stack: Stack, vault_key: IssuedKey, target: str
) -> None:
    """One authority per request, the Host header: a target naming another (which a proxy in
    front might route on while the gateway read the other) is not taken apart but refused
    as no path of the API (Envoy's 404 for a target that is not a path)."""
    _error(_get(stack, vault_key, "eu.localhost", target), 404)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost.", "api.gateway.test:8080", "[::1]"])
async def test_other_valid_hosts_reach_the_vault(
    stack: Stack, vault_key: IssuedKey, host: str
) -> None:
    response = _get(stack, vault_key, host)
    assert response.status == 200, (response.status, response.body[:300])
