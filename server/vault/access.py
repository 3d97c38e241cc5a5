"""Who may use which vault. The API key selects the workspace; intern routes act on one
intern of it; there is no default workspace and no fallback between scopes."""

from __future__ import annotations

from sqlmodel.ext.asyncio.session import AsyncSession

from server.auth import Principal
from server.db.models import Intern
from server.errors import GatewayError, bad_request, forbidden, not_found
from server.hostnames import InvalidHost, dns_name, host_of
from server.vault.store import Scope


async def vault_scope(
    session: AsyncSession,
    principal: Principal,
    intern_id: str | None,
    *,
    authority: str | None,
    regional_hosts: frozenset[str],
    write: bool,
) -> Scope:
    try:
        host = host_of(authority)
    except InvalidHost as exc:  # Envoy refuses these first; a direct caller is told the same
        raise bad_request("Invalid Host header") from exc
    # Both sides in DNS's canonical form: `EU.example.com.` is `eu.example.com`.
    if host is not None and host in {dns_name(h) for h in regional_hosts}:
        raise forbidden("The vault is not available on regional hostnames")
    workspace = principal.workspace
    if not workspace.intern_programme:
        raise not_found("Not Found")  # outside the intern programme the vault does not exist
    own_intern = principal.key.intern_id
    if intern_id is None:
        if own_intern is not None:
            raise not_found("Not Found")  # an intern's key is confined to its intern
        scope = Scope(workspace, None)
    else:
        if own_intern is not None and own_intern != intern_id:
            raise not_found(f"Intern {intern_id!r} not found")
        intern = await session.get(Intern, intern_id)
        if intern is None or intern.workspace_id != workspace.id:
            raise not_found(f"Intern {intern_id!r} not found")
        scope = Scope(workspace, intern)
    if write and workspace.vault_writes_disabled:
        raise GatewayError(503, "Vault writes are disabled for this workspace")
    return scope
