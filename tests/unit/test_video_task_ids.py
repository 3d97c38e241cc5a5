"""Task ids a provider hands back become part of later URLs: every task-polling adapter checks
them whole (`fullmatch`), so an id with a trailing newline is refused on submit and on poll,
before any request carries it (`^...$` with `match` lets "id\\n" through)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from server.clock import ManualClock
from server.providers.dashscope_video import DashScopeVideoAdapter
from server.providers.endpoint import Endpoint
from server.providers.failures import INVALID_RESPONSE, ProviderFailure
from server.providers.fal_video import QUEUE_SPEC, FalVideoAdapter
from server.providers.http import Downloads
from server.providers.kling_video import KlingVideoAdapter
from server.providers.minimax_video import MiniMaxVideoAdapter
from server.providers.openai_video import OpenAIVideoAdapter
from server.providers.replicate_video import ReplicateVideoAdapter
from server.providers.seedance_video import SeedanceVideoAdapter
from server.providers.video import VideoCall
from server.providers.video_tasks import TaskVideoAdapter

BASE = "https://provider.test/api"
Make = Callable[[httpx.AsyncClient], Any]


def _kling(http: httpx.AsyncClient) -> Any:
    return KlingVideoAdapter(http, ManualClock(datetime(2026, 11, 27, tzinfo=UTC)), Downloads(http))


# adapter, model, the submit answer naming a task id that ends in a newline, a poll id
CASES: dict[str, tuple[Make, str, dict[str, Any], str]] = {
    "seedance": (
        SeedanceVideoAdapter,
        "seedance-1-0-pro-250528",
        {"id": "cgt-1\n"},
        "cgt-1\n",
    ),
    "dashscope": (
        DashScopeVideoAdapter,
        "wan2.6-t2v",
        {"output": {"task_id": "t-1\n", "task_status": "PENDING"}, "request_id": "r"},
        "t-1\n",
    ),
    "replicate": (
        ReplicateVideoAdapter,
        "owner/model",
        {"id": "abc\n", "status": "starting"},
        "abc\n",
    ),
    "kling": (
        _kling,
        "kling-v1-6",
        {"code": 0, "message": "ok", "data": {"task_id": "k-1\n", "task_status": "submitted"}},
        "text2video/k-1\n",
    ),
    "minimax": (
        MiniMaxVideoAdapter,
        "MiniMax-Hailuo-02",
        {"task_id": "106\n", "base_resp": {"status_code": 0, "status_msg": "success"}},
        "106\n",
    ),
    "openai": (OpenAIVideoAdapter, "sora-2", {"id": "video_1\n", "status": "queued"}, "video_1\n"),
    "fal": (
        FalVideoAdapter,
        "fal-ai/m",
        {"request_id": "r-1\n", "response_url": f"{BASE}/fal-ai/m/requests/r-1\n"},
        "fal-ai/m/requests/r-1\n",
    ),
}


def _endpoint(name: str, model: str) -> Endpoint:
    return Endpoint(
        provider=name,
        adapter=name,
        base_url=BASE,
        api_key_env="TEST_TASK_ID_KEY",
        secret_key_env="TEST_TASK_ID_SECRET" if name == "kling" else None,
        model=model,
    )


def _call(model: str) -> VideoCall:
    return VideoCall(
        model=model, params={"prompt": "a cat", "duration": 6, "width": 1280, "height": 720}
    )


@pytest.fixture(autouse=True)
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_TASK_ID_KEY", "key")
    monkeypatch.setenv("TEST_TASK_ID_SECRET", "kling-test-secret-key-of-32-bytes!")


@pytest.mark.parametrize("name", list(CASES))
async def test_a_submitted_task_id_with_a_trailing_newline_is_refused(name: str) -> None:
    make, model, answer, _ = CASES[name]
    async with httpx.AsyncClient(
        transport=httpx.MockTransport(lambda request: httpx.Response(200, json=answer))
    ) as http:
        with pytest.raises(ProviderFailure) as failure:
            await make(http).submit(_endpoint(name, model), _call(model))
    assert failure.value.kind == INVALID_RESPONSE


@pytest.mark.parametrize("name", list(CASES))
async def test_a_polled_task_id_with_a_trailing_newline_is_refused_before_any_request(
    name: str,
) -> None:
    make, model, _, job_id = CASES[name]
    sent: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(500, json={})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as http:
        with pytest.raises(ProviderFailure) as failure:
            await make(http).poll(_endpoint(name, model), job_id, _call(model))
    assert failure.value.kind == INVALID_RESPONSE
    assert sent == []


# A job id each task-polling adapter keeps, as its provider hands them out.
GOOD_IDS: dict[type[TaskVideoAdapter], str] = {
    SeedanceVideoAdapter: "cgt-20250331175019-68d9t",
    DashScopeVideoAdapter: "0385dc79-5ff8-4d82-bcb6-xxxxxx",
    ReplicateVideoAdapter: "gm3qorzdhgbfurvjtvhg6dckhu",
    KlingVideoAdapter: "text2video/CjMTPWkGcJIAAAAAAB0Yzw",
    MiniMaxVideoAdapter: "106916112212032",
    OpenAIVideoAdapter: "video_68d7512d07848190b3e45da0ecbebcde004da08e1e0678d5",
    FalVideoAdapter: "fal-ai/kling-video/requests/764cabcf-b745-4b3e-ae38-1200304cf45b",
}


def test_every_task_adapter_is_covered() -> None:
    import server.app  # noqa: F401  (imports every adapter the gateway registers)

    assert set(TaskVideoAdapter.__subclasses__()) == set(GOOD_IDS)


@pytest.mark.parametrize(
    "spec, good",
    [(adapter.spec, good) for adapter, good in GOOD_IDS.items()] + [(QUEUE_SPEC, "m/requests/r1")],
)
def test_every_spec_id_pattern_rejects_a_trailing_newline(spec: Any, good: str) -> None:
    assert spec.id_pattern.fullmatch(good)
    for bad in (f"{good}\n", f"{good}\r\n", f"\n{good}", f"{good}/../x", f"{good} "):
        assert not spec.id_pattern.fullmatch(bad)


def test_a_fal_job_path_never_climbs_out_of_the_base_url() -> None:
    for bad in ("../requests/r1", "fal-ai/../requests/r1", "./requests/r1", "/fal-ai/requests/r1"):
        assert not QUEUE_SPEC.id_pattern.fullmatch(bad)
