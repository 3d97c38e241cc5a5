"""Host names compared the way DNS compares them: one form for every comparison (regional
hosts, vault secret hosts), so `EU.example.com.`, `eu.example.com:443` and
`eu.example.com` are one host, and an internationalized name is its IDNA (punycode) form."""

from __future__ import annotations


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
    """The host of an HTTP authority (`Host` header / `:authority`), without its port, in
    the canonical form of `dns_name`. IPv6 literals keep their brackets."""
    if authority is None:
        return None
    text = authority.strip()
    if not text:
        return None
    if text.startswith("["):
        return text.split("]", 1)[0].lower() + "]"
    if text.count(":") == 1:
        text = text.rsplit(":", 1)[0]
    return dns_name(text) or None
