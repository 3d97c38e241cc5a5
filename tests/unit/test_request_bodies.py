"""Request bodies within bounds (issue 29, server/transcription/body.py): a body is read only
after its caller is known, never past the per-request limit, and within a process-wide budget
(wait briefly, then 503 + Retry-After); a failed call keeps none of its body alive."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.api import httpbody_pb2
from opentelemetry.trace import NoOpTracer

from facade.compose import compose_envoy_options
from facade.envoy_config import render
from server.config import EdgePolicy
from server.contract import audio_pb2_grpc
from server.errors import GatewayError
from server.observability.metrics import Metrics
from server.services.audio import HttpBodyMessages
from server.services.rpc import MethodTable, ObservedServer, RequestObserver
from server.transcription.body import BODY_COPIES, BodyBudget, declared_length, read_body
from testkit.eventually import eventually

MIB = 1024 * 1024


class _Messages:
    """A client stream of HttpBody messages that counts what the reader pulled."""

    def __init__(self, *chunks: bytes, content_type: str = "application/json") -> None:
        self.chunks = chunks
        self.content_type = content_type
        self.pulled = 0

    async def __aiter__(self) -> AsyncIterator[httpbody_pb2.HttpBody]:
        for index, chunk in enumerate(self.chunks):
            self.pulled += 1
            yield httpbody_pb2.HttpBody(
                content_type=self.content_type if index == 0 else "", data=chunk
            )


def _budget(capacity: int, wait: float = 0.1) -> BodyBudget:
    return BodyBudget(capacity, wait_seconds=wait, retry_after_seconds=3)


async def test_a_body_is_joined_with_the_content_type_of_its_first_message() -> None:
    budget = _budget(BODY_COPIES * 100)
    async with budget.reservation() as reservation:
        body = await read_body(
            HttpBodyMessages(_Messages(b"ab", b"cd", b"e").__aiter__()), reservation, 100, 5
        )
        assert (body.data, body.content_type) == (b"abcde", "application/json")
        assert budget.free == BODY_COPIES * 95
    assert budget.free == budget.capacity


async def test_the_content_type_comes_from_the_first_message_even_without_bytes() -> None:
    async with _budget(BODY_COPIES * 100).reservation() as reservation:
        body = await read_body(
            HttpBodyMessages(_Messages(b"", b"ab", b"").__aiter__()), reservation, 100, None
        )
        empty = await read_body(HttpBodyMessages(_Messages().__aiter__()), reservation, 100, 0)
    assert (body.data, body.content_type) == (b"ab", "application/json")
    assert (empty.data, empty.content_type) == (b"", "")


async def test_a_declared_body_over_the_limit_is_refused_before_it_is_read() -> None:
    messages = _Messages(b"x" * 10)
    async with _budget(BODY_COPIES * 100).reservation() as reservation:
        with pytest.raises(GatewayError) as refused:
            await read_body(HttpBodyMessages(messages.__aiter__()), reservation, 9, 10)
    assert refused.value.status == 413 and messages.pulled == 0


async def test_a_chunked_body_over_the_limit_is_refused_at_the_chunk_that_crosses_it() -> None:
    messages = _Messages(b"x" * 4, b"x" * 4, b"x" * 4, b"x" * 4)
    budget = _budget(BODY_COPIES * 100)
    async with budget.reservation() as reservation:
        with pytest.raises(GatewayError) as refused:
            await read_body(HttpBodyMessages(messages.__aiter__()), reservation, 10, None)
    assert refused.value.status == 413 and messages.pulled == 3
    assert budget.free == budget.capacity


async def test_a_body_that_finds_the_budget_spent_waits_then_gets_503_with_retry_after() -> None:
    budget = _budget(BODY_COPIES * 100, wait=0.2)
    async with budget.reservation() as holder:
        await holder.take(BODY_COPIES * 60)
        messages = _Messages(b"x" * 50)
        async with budget.reservation() as reservation:
            started = asyncio.get_running_loop().time()
            with pytest.raises(GatewayError) as refused:
                await read_body(HttpBodyMessages(messages.__aiter__()), reservation, 100, 50)
            waited = asyncio.get_running_loop().time() - started
    assert refused.value.status == 503 and refused.value.retry_after_seconds == 3
    assert 0.15 <= waited < 2 and messages.pulled == 0  # nothing read while it waited
    assert budget.free == budget.capacity


async def test_a_waiting_body_goes_on_as_soon_as_another_gives_its_share_back() -> None:
    budget = _budget(BODY_COPIES * 100, wait=5)
    holder = budget.reservation()
    await holder.take(BODY_COPIES * 60)

    async def second() -> bytes:
        async with budget.reservation() as reservation:
            body = await read_body(
                HttpBodyMessages(_Messages(b"y" * 50).__aiter__()), reservation, 100, 50
            )
            return body.data

    waiting = asyncio.ensure_future(second())
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await holder.__aexit__(None, None, None)
    assert await asyncio.wait_for(waiting, 2) == b"y" * 50
    assert budget.free == budget.capacity


async def test_a_chunked_body_that_alone_holds_the_budget_is_refused_at_once() -> None:
    """Nothing another body holds could come back to it: waiting would only delay the 503."""
    budget = _budget(BODY_COPIES * 10, wait=30)
    messages = _Messages(b"x" * 6, b"x" * 6)
    async with budget.reservation() as reservation:
        with pytest.raises(GatewayError) as refused:
            async with asyncio.timeout(2):
                await read_body(HttpBodyMessages(messages.__aiter__()), reservation, 100, None)
    assert refused.value.status == 503 and messages.pulled == 2
    assert budget.free == budget.capacity


class _Gated:
    """A chunked body (a BodySource): its first chunk at once, the rest once `go` is set."""

    content_type = "application/json"

    def __init__(self, first: bytes, rest: bytes, go: asyncio.Event) -> None:
        self._first, self._rest, self._go = first, rest, go

    async def chunks(self) -> AsyncIterator[bytes]:
        yield self._first
        await self._go.wait()
        yield self._rest


@dataclass
class _TwoChunkedBodies:
    """An older and a younger chunked body of 12 bytes, each holding its first 6 of a
    budget of 16: each needs more than is left. `send(name)` lets a body's rest arrive."""

    budget: BodyBudget
    older: asyncio.Task[bytes]
    younger: asyncio.Task[bytes]
    gates: dict[str, asyncio.Event]

    def send(self, name: str) -> None:
        self.gates[name].set()

    async def assert_the_older_finished(self) -> None:
        with pytest.raises(GatewayError) as refused:
            await self.younger
        assert refused.value.status == 503
        assert await self.older == b"o" * 12
        assert self.budget.free == self.budget.capacity


async def _two_chunked_bodies(wait: float) -> _TwoChunkedBodies:
    budget = _budget(BODY_COPIES * 16, wait=wait)
    gates = {"older": asyncio.Event(), "younger": asyncio.Event()}

    async def read(name: str) -> bytes:
        async with budget.reservation() as reservation:
            source = _Gated(name[:1].encode() * 6, name[:1].encode() * 6, gates[name])
            return (await read_body(source, reservation, 100, None)).data

    older = asyncio.create_task(read("older"))
    await eventually(lambda: budget.free == BODY_COPIES * 10)  # reserved first
    younger = asyncio.create_task(read("younger"))
    await eventually(lambda: budget.free == BODY_COPIES * 4)  # each holds 6 of 16
    return _TwoChunkedBodies(budget, older, younger, gates)


async def test_chunked_bodies_that_wait_for_each_other_let_the_older_finish() -> None:
    """Two chunked bodies each hold part of the budget and need more than is left: each
    waits, as the other may give some back. When the older one's wait ends, the younger is
    refused instead (503) and gives back what it held: the older finishes. Refused at once,
    or each at the end of its own wait, both would have been."""
    bodies = await _two_chunked_bodies(wait=0.3)
    bodies.send("older")
    await asyncio.sleep(0.1)  # the younger body's next bytes arrive a little later
    bodies.send("younger")
    await bodies.assert_the_older_finished()


async def test_a_younger_body_still_reading_gives_way_at_its_next_bytes() -> None:
    """The younger body is not waiting when the older one's wait ends (its next bytes have
    not arrived): it is refused when they do, and the older one has what it gave back."""
    bodies = await _two_chunked_bodies(wait=0.2)
    bodies.send("older")
    # Past the older one's wait (0.2 s): it waits one more for the younger to give way.
    await asyncio.sleep(0.3)
    assert not bodies.older.done()
    bodies.send("younger")
    await bodies.assert_the_older_finished()


async def test_a_body_larger_than_the_whole_budget_is_413_at_once_not_a_503_to_retry() -> None:
    budget = _budget(BODY_COPIES * 10, wait=30)
    async with budget.reservation() as reservation:
        with pytest.raises(GatewayError) as refused:
            async with asyncio.timeout(2):
                await read_body(
                    HttpBodyMessages(_Messages(b"x" * 11).__aiter__()), reservation, 100, 11
                )
    assert refused.value.status == 413 and refused.value.retry_after_seconds is None


@pytest.mark.parametrize(
    ("value", "length"),
    [("12", 12), ("0", 0), (None, None), ("", None), ("-1", None), ("1e3", None), ("9" * 19, None)],
)
def test_only_a_plain_declared_length_is_trusted(value: str | None, length: int | None) -> None:
    assert declared_length(value) == length


# --- A failed call keeps none of its body alive --------------------------------------------


class _Body(bytearray):
    """A body that can be watched (bytes cannot be weakly referenced)."""


class _Context:
    """grpc.aio's servicer context as far as the observer uses it; like grpc, it keeps the
    AbortError it raised (grpc's RPCState does, past the call)."""

    def __init__(self) -> None:
        self.kept: list[BaseException] = []

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("x-request-id", "rid-1"),)

    async def abort(self, code: Any, details: str, trailing_metadata: Any = ()) -> None:
        error = grpc.aio.AbortError()
        self.kept.append(error)
        raise error


class _Refusing(audio_pb2_grpc.AudioServicer):
    def __init__(self) -> None:
        self.bodies: list[weakref.ref[_Body]] = []

    async def Transcribe(self, requests: Any, context: grpc.aio.ServicerContext) -> Any:
        body = _Body()
        async for message in requests:
            body += message.data
        self.bodies.append(weakref.ref(body))
        _parse(body)


def _parse(body: _Body) -> None:
    raise GatewayError(413, "The audio is larger than 25 MB")


class _TranscribeCall:
    method = "/gateway.v1.Audio/Transcribe"
    invocation_metadata = ()


@pytest.fixture
def no_collector() -> Iterator[None]:
    """What reference counting alone frees: the collector may not run for a long while (the
    server raises its thresholds, app.tune_garbage_collector)."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def test_a_failed_call_keeps_none_of_its_body_alive(no_collector: None) -> None:
    servicer = _Refusing()
    table = MethodTable()
    server: Any = ObservedServer(table, RequestObserver(Metrics(), NoOpTracer()))
    audio_pb2_grpc.add_AudioServicer_to_server(servicer, server)
    handler: Any = table.service(_TranscribeCall())  # type: ignore[arg-type]
    context = _Context()
    with pytest.raises(grpc.aio.AbortError):
        await handler.stream_unary(_Messages(b"x" * MIB).__aiter__(), context)
    assert context.kept, "the context keeps the abort, as grpc does"
    assert servicer.bodies[0]() is None, "the kept exception holds the handler's body"


async def test_the_heap_is_trimmed_once_the_budget_is_idle_after_a_burst() -> None:
    """The pages a burst of bodies took go back to the system when the burst is over (in a
    thread, once a quarter of the budget was lent since the last trim), not while bodies are
    held, and not after every small body."""
    trims: list[int] = []
    budget = BodyBudget(100, wait_seconds=0.1, retry_after_seconds=1, trim=lambda: trims.append(1))
    async with budget.reservation() as small:
        await small.take(10)
    assert trims == []  # less than a quarter lent
    async with budget.reservation() as first, budget.reservation() as second:
        await first.take(20)
        await second.take(20)
        await first.__aexit__(None, None, None)
        assert trims == []  # still held by the second
    await eventually(lambda: trims == [1], within=2)  # in the executor's thread
    async with budget.reservation() as again:
        await again.take(10)
    await asyncio.sleep(0.05)
    assert trims == [1]  # the count starts again after a trim


def test_envoy_holds_bounded_bodies_per_connection_per_stream_and_as_a_whole() -> None:
    config = render(compose_envoy_options(edge=EdgePolicy(GATEWAY_EDGE_MAX_HEAP_BYTES=256 * MIB)))
    listener = config["static_resources"]["listeners"][0]
    assert listener["per_connection_buffer_limit_bytes"] == MIB
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    assert manager["http2_protocol_options"] == {
        "initial_stream_window_size": 64 * 1024,
        "initial_connection_window_size": MIB,
    }
    overload = config["overload_manager"]
    heap = [m for m in overload["resource_monitors"] if m["name"].endswith("fixed_heap")]
    assert heap[0]["typed_config"]["max_heap_size_bytes"] == 256 * MIB
    actions = {a["name"]: a["triggers"][0]["threshold"]["value"] for a in overload["actions"]}
    assert actions == {
        "envoy.overload_actions.shrink_heap": 0.90,
        "envoy.overload_actions.stop_accepting_requests": 0.95,
    }
    buffers = [f for f in manager["http_filters"] if f["name"] == "envoy.filters.http.buffer"]
    assert buffers[0]["typed_config"]["max_request_bytes"] == MIB  # the control routes' limit


async def test_dropping_a_failed_calls_tracebacks_never_finalizes_a_coroutine_still_running() -> (
    None
):
    """A failure raised inside the writer's group commit carries that shared coroutine's frame
    in its traceback: letting go of the failure's frames must leave the coroutine running for
    the others (frame.clear() finalized it: the batch died for every request in it)."""
    import asyncio

    from server.services.rpc import _drop_tracebacks

    caught: list[BaseException] = []
    gate = asyncio.Event()

    async def shared() -> str:
        try:
            raise ValueError("one unit's failure")
        except ValueError as exc:
            caught.append(exc)
        await gate.wait()
        return "the batch went on"

    task = asyncio.create_task(shared())
    await asyncio.sleep(0)
    assert caught and caught[0].__traceback__ is not None
    _drop_tracebacks(caught[0])
    assert caught[0].__traceback__ is None
    gate.set()
    assert await task == "the batch went on"


async def test_one_workspaces_bodies_hold_only_its_share_and_leave_the_rest_to_others() -> None:
    """A workspace's burst of large bodies waits (then 503) for its own share, while another
    workspace's body is read at once. Before: the budget was one pool, and the burst made
    every workspace's bodies wait."""
    budget = BodyBudget(
        BODY_COPIES * 100, wait_seconds=0.2, retry_after_seconds=3, share=BODY_COPIES * 60
    )
    async with budget.reservation("ws_burst") as first:
        await first.take(BODY_COPIES * 50)
        async with budget.reservation("ws_burst") as second:
            with pytest.raises(GatewayError) as refused:
                await read_body(HttpBodyMessages(_Messages(b"x" * 20).__aiter__()), second, 100, 20)
            assert refused.value.status == 503 and refused.value.retry_after_seconds == 3
        async with budget.reservation("ws_other") as other:
            body = await read_body(
                HttpBodyMessages(_Messages(b"y" * 40).__aiter__()), other, 100, 40
            )
            assert body.data == b"y" * 40
    assert budget.free == budget.capacity


async def test_a_body_over_the_share_is_413_and_a_waiting_one_goes_on_when_its_own_end() -> None:
    budget = BodyBudget(
        BODY_COPIES * 100, wait_seconds=5, retry_after_seconds=3, share=BODY_COPIES * 60
    )
    async with budget.reservation("ws_a") as reservation:
        with pytest.raises(GatewayError) as refused:
            await read_body(
                HttpBodyMessages(_Messages(b"x" * 70).__aiter__()), reservation, 100, 70
            )
    assert refused.value.status == 413
    holder = budget.reservation("ws_a")
    await holder.take(BODY_COPIES * 50)

    async def own_next() -> bytes:
        async with budget.reservation("ws_a") as reservation:
            return (
                await read_body(
                    HttpBodyMessages(_Messages(b"z" * 20).__aiter__()), reservation, 100, 20
                )
            ).data

    waiting = asyncio.ensure_future(own_next())
    await asyncio.sleep(0.05)
    assert not waiting.done()  # the budget has room (50 of 100), the workspace's share has not
    await holder.__aexit__(None, None, None)
    assert await asyncio.wait_for(waiting, 2) == b"z" * 20
    assert budget.free == budget.capacity


def test_the_default_share_leaves_room_for_one_largest_body_of_another_workspace() -> None:
    from server.transcription.body import workspace_share

    mib = 1024 * 1024
    assert workspace_share(512 * mib, 50 * mib) == 512 * mib - BODY_COPIES * 50 * mib
    assert workspace_share(100 * mib, 50 * mib) == 50 * mib  # never under half the budget
