"""Host names compared the way DNS compares them: one form for every comparison (regional
hosts, vault secret hosts), so `EU.example.com.`, `eu.example.com:443` and
`eu.example.com` are one host, and an internationalized name is its IDNA (punycode) form.

And the one grammar of a valid HTTP authority (`Host` / `:authority`), which Envoy enforces
at the edge (facade/envoy_config.py renders `VALID_AUTHORITY` into its config) and the
server applies again to what it is given (`host_of`)."""

from __future__ import annotations

import re

# A DNS label as host names have it (letters, digits, inner hyphens; an internationalized
# name arrives in its IDNA "xn--" form: a Host header is ASCII).
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
# 1 to 65535, no leading zero.
_PORT = r"(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
# The authority a client may send, after Envoy stripped one trailing dot (the DNS root) of
# the host: a host name or IPv4 address (dot-separated labels), or an IPv6 literal in
# brackets; then optionally ':' and a port. No user info, percent-encoding, empty labels,
# empty port or anything else: both RE2 (Envoy) and Python's re read it alike.
VALID_AUTHORITY = rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9A-Fa-f:.]+\])(?::{_PORT})?"
_AUTHORITY = re.compile(VALID_AUTHORITY)


class InvalidHost(ValueError):
    """An authority outside `VALID_AUTHORITY`."""


def dns_name(host: str) -> str:
    """The canonical form of a DNS name: surrounding space removed, one trailing dot (the
    root) removed, lowercased, each label in its IDNA ASCII form. A name IDNA cannot encode
    is returned lowercased as given (comparisons then simply find no match)."""
    name = host.strip()
    if name.endswith("."):
        name = name[:-1]
    name = name.lower()
    if name.isascii():
        return name
    try:
        return name.encode("idna").decode("ascii").lower()
    except UnicodeError:
        return name


def host_of(authority: str | None) -> str | None:
    """The host of an HTTP authority (`Host` header / `:authority`) without its port, in the
    canonical form of `dns_name`; None when there is none. One trailing dot of the host is
    the DNS root (Envoy strips it; a direct caller may not). An authority outside
    `VALID_AUTHORITY` is an InvalidHost: never guessed at, so no spelling of a host can be
    read as another."""
    if not authority:
        return None
    if authority.startswith("["):  # an IPv6 literal, perhaps with a port
        checked, host = authority, authority.partition("]")[0] + "]"
    else:
        host, separator, port = authority.partition(":")
        host = host.removesuffix(".")
        checked = host + separator + port
    if _AUTHORITY.fullmatch(checked) is None:
        raise InvalidHost(authority)
    return host.lower() if host.startswith("[") else dns_name(host)
