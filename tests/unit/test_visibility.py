"""Issue 29 item 11 in-process: the one rule of who sees a record a key created
(server/auth.py `sees`, `visible`, `own_records`) and the id lookups that follow it: a video
job (get, content, webhooks, cancel, continuation all go through `find_job`) and a
generation. A standard key: its own only; a management key: its whole workspace; another
workspace: nothing. Hidden is answered exactly as unknown."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from server.auth import Principal, own_records, sees, visible
from server.errors import GatewayError, not_found
from server.videos import jobs
from server.videos.cancel import cancel_job
from testkit.admin import IssuedKey
from testkit.domain import Domain, video_input


@dataclass
class Record:
    workspace_id: str
    key_hash: str


@dataclass
class Callers:
    owner: Principal
    sibling: Principal
    manager: Principal
    stranger: Principal  # another workspace's management key


@pytest.fixture
async def callers(domain: Domain) -> Callers:
    owner = await domain.funded_key("vis-owner")
    workspace = owner.workspace
    other = await domain.funded_key("vis-other")
    keys: list[IssuedKey] = [
        await domain.admin.key(workspace, "sibling"),
        await domain.admin.key(workspace, "manager", management=True),
        await domain.admin.key(other.workspace, "stranger", management=True),
    ]
    sibling, manager, stranger = [await domain.principal(k) for k in keys]
    return Callers(await domain.principal(owner), sibling, manager, stranger)


def test_the_rule(callers: Callers) -> None:
    mine = Record(callers.owner.workspace.id, callers.owner.key.hash)
    assert sees(callers.owner, mine) and sees(callers.manager, mine)
    assert not sees(callers.sibling, mine) and not sees(callers.stranger, mine)
    # A management key's own record is hidden from the standard keys beside it too.
    managers = Record(callers.manager.workspace.id, callers.manager.key.hash)
    assert not sees(callers.owner, managers)
    # Lists: a standard key is narrowed to itself, a management key to what it asks.
    assert own_records(callers.owner) == callers.owner.key.hash
    assert own_records(callers.manager) == "" and own_records(callers.manager, "h") == "h"
    with pytest.raises(GatewayError) as refused:
        own_records(callers.owner, callers.sibling.key.hash)
    assert refused.value.status == 403


def test_hidden_is_answered_as_unknown(callers: Callers) -> None:
    answer = not_found("Thing 'x' not found")
    mine = Record(callers.owner.workspace.id, callers.owner.key.hash)
    assert visible(callers.owner, mine, answer) is mine
    for caller, record in ((callers.sibling, mine), (callers.owner, None)):
        with pytest.raises(GatewayError) as hidden:
            visible(caller, record, answer)
        assert hidden.value is answer


async def test_a_video_job_by_id_follows_the_rule(domain: Domain, callers: Callers) -> None:
    model = domain.catalog.get("unitvideo/ok")
    assert model is not None
    async with domain.sessions() as session:
        submitted = await jobs.submit_job(
            session, callers.owner, video_input(model), domain.clock.now(), None, domain.limits
        )
        job_id = submitted.id
        for caller in (callers.owner, callers.manager):
            assert (await jobs.find_job(session, caller, job_id)).id == job_id
        for caller in (callers.sibling, callers.stranger):
            with pytest.raises(GatewayError) as hidden:
                await jobs.find_job(session, caller, job_id)
            assert hidden.value.status == 404
            assert hidden.value.message == f"Video job {job_id!r} not found"
    for caller in (callers.sibling, callers.stranger):
        with pytest.raises(GatewayError) as refused:
            await cancel_job(domain.sessions, caller, job_id, domain.clock.now())
        assert refused.value.status == 404
    cancelled = await cancel_job(domain.sessions, callers.manager, job_id, domain.clock.now())
    assert cancelled.status == jobs.CANCELLED
