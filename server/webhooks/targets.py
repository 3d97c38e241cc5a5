"""Where a webhook may go: HTTPS only, and — after DNS resolution, so a name cannot point
inside — never to private, loopback, link-local or otherwise non-public addresses unless
the operator allows it (GATEWAY_WEBHOOK_ALLOW_PRIVATE=1). `resolve_target` is the same check
for every URL the gateway fetches that someone else named: a webhook target, a client's image
URL, a provider's result file (server/providers/http.py)."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from server.errors import bad_request
from server.validation import check_text

MAX_CALLBACK_URL_CHARS = 2048  # the column's width


def check_callback_url(url: str, param: str = "callback_url") -> str:
    """The check when a URL is given (400 naming `param`): a complete https URL the
    standard library parses in full — a host, a port (if any) in 1-65535, no credentials,
    no whitespace or control characters, at most 2048 characters. Addresses are checked
    when the webhook is sent (`resolve_target`), since DNS can change in between."""
    if not url:
        raise bad_request(f"{param} must be an https:// URL", param=param)
    if len(url) > MAX_CALLBACK_URL_CHARS:
        raise bad_request(
            f"{param} must be at most {MAX_CALLBACK_URL_CHARS} characters", param=param
        )
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise bad_request(f"{param} must not contain spaces or control characters", param=param)
    check_text(url, param)
    try:
        parts = urlsplit(url)
        port = parts.port  # raises for a port that is not a number in 0-65535
        host = parts.hostname
    except ValueError as exc:
        raise bad_request(
            f"{param} is not a valid URL (check its host and port)", param=param
        ) from exc
    if parts.scheme.lower() != "https" or not host:
        raise bad_request(f"{param} must be an https:// URL", param=param)
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise bad_request(f"{param} must not carry credentials", param=param)
    if port == 0 or (port is None and parts.netloc.endswith(":")):
        raise bad_request(f"{param} has an invalid port", param=param)
    try:
        host.encode("idna")
    except UnicodeError as exc:
        raise bad_request(f"{param} has an invalid host name", param=param) from exc
    return url


class RefusedTarget(Exception):
    """The URL must not be called; the message is safe to record."""


class UnresolvedTarget(Exception):
    """The host's DNS lookup failed (perhaps for now): retried on the normal schedule.
    The message is safe to record."""


@dataclass(frozen=True)
class ResolvedTarget:
    url: str  # the URL with the host replaced by the checked IP address
    host_header: str
    sni_hostname: str


# A DNS lookup: a host and port to the addresses it resolves to (tests give their own).
Lookup = Callable[[str, int], Awaitable[list[str]]]


async def dns_lookup(host: str, port: int) -> list[str]:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]  # AF_INET/AF_INET6: always a str


def is_public(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


async def resolve_target(
    url: str, *, allow_private: bool, lookup: Lookup = dns_lookup
) -> ResolvedTarget:
    try:
        parts = urlsplit(url)
        port = parts.port or 443
    except ValueError as exc:  # stored before URLs were checked in full
        raise RefusedTarget("not a valid URL") from exc
    if parts.scheme.lower() != "https" or not parts.hostname:
        raise RefusedTarget("webhook URLs must be https://")
    host = parts.hostname
    try:
        addresses = await lookup(host, port)
    except UnicodeError as exc:  # no DNS name at all (e.g. an empty or overlong label)
        raise RefusedTarget("not a valid host name") from exc
    except socket.gaierror as exc:
        # A failed lookup may be temporary (or the name registered later): retry it.
        raise UnresolvedTarget(f"cannot resolve {host}") from exc
    if not addresses:
        raise UnresolvedTarget(f"cannot resolve {host}")
    if not allow_private:
        blocked = [a for a in addresses if not is_public(a)]
        if blocked:
            raise RefusedTarget(f"{host} resolves to a non-public address")
    address = addresses[0]
    literal = f"[{address}]" if ":" in address else address
    netloc = f"{literal}:{port}"
    host_header = host if parts.port is None else f"{host}:{parts.port}"
    pinned = urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))
    return ResolvedTarget(url=pinned, host_header=host_header, sni_hostname=host)
