"""GET /vault/secrets/{name} and the intern route's domain (server/vault/store.get_secret):
one scope's secret, metadata only; another scope's secret of the same name is not it."""

from __future__ import annotations

import pytest

from server.errors import GatewayError
from server.vault import store
from server.vault.crypto import MasterKey
from testkit.domain import Domain


async def test_one_secret_of_its_own_scope_only(domain: Domain) -> None:
    workspace = await domain.admin.workspace("vault-get", intern_programme=True)
    intern = await domain.admin.intern(workspace, "ada")
    master = MasterKey.from_base64(MasterKey.generate_base64())
    shared, own = store.Scope(workspace, None), store.Scope(workspace, intern)
    now = domain.clock.now()
    async with domain.sessions() as session:
        await store.put_secret(session, master, shared, "api_token", "s3cret", ["a.example"], now)
        await store.put_secret(session, master, own, "only_mine", "m1ne", ["b.example"], now)
        await session.commit()
        found = await store.get_secret(session, shared, "api_token")
        assert (found.name, list(found.hosts)) == ("api_token", ["a.example"])
        assert found.fingerprint and "s3cret" not in store.record(found).values()
        assert (await store.get_secret(session, own, "only_mine")).scope == intern.id
        for scope, name, status in (
            (own, "api_token", 404),  # the workspace's: listed as effective, not the intern's
            (shared, "only_mine", 404),
            (shared, "Bad-Name", 400),
        ):
            with pytest.raises(GatewayError) as refused:
                await store.get_secret(session, scope, name)
            assert refused.value.status == status
