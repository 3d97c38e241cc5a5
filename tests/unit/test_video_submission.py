"""Video submissions through the group-commit writer, as the API makes them, on both backends
(on PostgreSQL a plain hold and the job row are one statement, server/billing/holds.py
reserve_and_insert): exactly as many jobs as the credits hold, each with its hold; a refused
job writes nothing and says why; every admission and refusal is counted once."""

from __future__ import annotations

import asyncio
import functools

import pytest

from server.db.models import CreditHold, VideoJob
from server.errors import GatewayError
from server.limits.guardrail_budgets import GuardrailBudget
from server.videos import jobs
from server.videos.request import VideoInput
from testkit.admin import IssuedKey
from testkit.domain import Domain, video_input

JOB_MICROS = 100_000  # unitvideo/ok: 0.05 USD/s for 2 s


def _video(domain: Domain) -> VideoInput:
    model = domain.catalog.get("unitvideo/ok")
    assert model is not None
    return video_input(model)


async def _submit_all(
    domain: Domain, issued: IssuedKey, n: int, budgets: tuple[GuardrailBudget, ...] = ()
) -> list[dict[str, object] | BaseException]:
    principal = await domain.principal(issued)
    video = _video(domain)

    def unit() -> functools.partial[object]:
        return functools.partial(
            jobs.store_job,
            principal=principal,
            video=video,
            now=domain.clock.now(),
            default_callback_url=None,
            limits=domain.limits,
            budgets=budgets,
            admitted=domain.metrics.admissions.labels("admitted").inc,
        )

    return await asyncio.gather(
        *(domain.writer.run(unit()) for _ in range(n)), return_exceptions=True
    )


def _counted(domain: Domain, outcome: str) -> int:
    return int(domain.metrics.admissions.labels(outcome)._value.get())


@pytest.mark.parametrize("budgeted", [False, True], ids=["plain hold", "guardrail budget"])
async def test_exactly_the_jobs_the_credits_hold(any_domain: Domain, budgeted: bool) -> None:
    domain = any_domain
    issued = await domain.funded_key("video-exact", usd="0.35")  # 3 jobs of 0.10, not 4
    roomy = GuardrailBudget("guardrail-1", "roomy", 10_000_000, "monthly", False)
    budgets = (roomy,) if budgeted else ()
    results = await _submit_all(domain, issued, 8, budgets)

    accepted = [r for r in results if isinstance(r, dict)]
    refused = [r for r in results if isinstance(r, GatewayError)]
    assert len(accepted) == 3 and len(refused) == 5, results
    assert {r.status for r in refused} == {402}
    assert {(r.metadata or {}).get("limit_source") for r in refused} == {
        "openrouter_in_flight_budget"
    }
    stored = await domain.rows(VideoJob)
    holds = await domain.rows(CreditHold)
    assert sorted(j.id for j in stored) == sorted(str(r["id"]) for r in accepted)
    assert sorted(h.id for h in holds) == sorted(str(j.hold_id) for j in stored)
    assert {h.amount_micros for h in holds} == {JOB_MICROS}
    assert all(j.hold_micros == JOB_MICROS and j.status == jobs.PENDING for j in stored)
    assert _counted(domain, "admitted") == 3
    assert _counted(domain, "in_flight_budget") == 5


async def test_an_unfunded_account_stores_nothing(any_domain: Domain) -> None:
    domain = any_domain
    issued = await domain.funded_key("video-unfunded", usd="0")
    (refused,) = await _submit_all(domain, issued, 1)
    assert isinstance(refused, GatewayError) and refused.status == 402
    assert (refused.metadata or {}).get("limit_source") == "openrouter_credits"
    assert await domain.count(VideoJob) == 0
    assert await domain.count(CreditHold) == 0
    assert _counted(domain, "admitted") == 0
    assert _counted(domain, "credits") == 1
