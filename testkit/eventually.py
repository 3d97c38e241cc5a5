"""Waiting for an outcome instead of sleeping: one helper for every "until it happens" loop."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")


@overload
async def eventually(
    predicate: Callable[[], Awaitable[T]],
    within: float = ...,
    interval: float = ...,
    message: str = ...,
) -> T: ...


@overload
async def eventually(
    predicate: Callable[[], T],
    within: float = ...,
    interval: float = ...,
    message: str = ...,
) -> T: ...


async def eventually(
    predicate: Callable[[], Any],
    within: float = 20.0,
    interval: float = 0.05,
    message: str = "",
) -> Any:
    """The first truthy value `predicate` returns (it may be sync or async), polled every
    `interval` seconds; fails the test with `message` (and the last value) after `within`
    seconds. Use it for outcomes that take a while to arrive, never to wait for "nothing
    happened": wait for a signal that proves the system went past that point instead."""
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"not within {within} s: {message or getattr(predicate, '__name__', 'predicate')}"
                f" (last value: {value!r})"
            )
        await asyncio.sleep(interval)
