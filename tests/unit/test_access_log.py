"""The access line built directly (server/observability/logs.py: log_access) is the line the
logging machinery would have written, and the background handler writes every line, in
order, by the time it is flushed."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.observability.logs import (
    BackgroundStreamHandler,
    JsonFormatter,
    RequestIdFilter,
    configure_logging,
    log_access,
)

ROUTES = st.sampled_from(["GET /api/v1/key", "POST /api/v1/audio/transcriptions", "/x.Y/Z"])


def _formatted(
    created: float, route: str, status: int, duration_ms: float, request_id: str | None
) -> str:
    """What JsonFormatter makes of the record log_access's fallback logs."""
    record = logging.getLogger("gateway.rpc").makeRecord(
        "gateway.rpc",
        logging.INFO,
        "",
        0,
        "%s %s %.1f ms",
        (route, status, duration_ms),
        None,
        extra={"route": route, "status": status, "duration_ms": duration_ms},
    )
    record.created = created
    record.request_id = request_id
    return JsonFormatter().format(record)


@settings(max_examples=300, deadline=None, database=None)
@given(
    created=st.floats(0, 4e9, allow_nan=False),
    route=ROUTES | st.text(max_size=30),
    status=st.sampled_from([200, 201, 202, 204, 400, 401, 402, 429, 499, 500, 503]),
    duration_ms=st.floats(0, 1e6, allow_nan=False),
    request_id=st.none() | st.text(max_size=40),
)
def test_the_direct_line_is_the_formatted_record(
    created: float, route: str, status: int, duration_ms: float, request_id: str | None
) -> None:
    direct = JsonFormatter().access_line(
        "gateway.rpc", created, route, status, duration_ms, request_id
    )
    assert direct == _formatted(created, route, status, duration_ms, request_id)


def test_a_secret_in_a_request_id_is_redacted() -> None:
    formatter = JsonFormatter()
    line = formatter.access_line("gateway.rpc", 0.0, "GET /api/v1/key", 200, 1.0, "sk-gw-v1-abc")
    assert "sk-gw-v1-abc" not in line
    assert json.loads(line)["request_id"] == "sk-gw-v1-[redacted]"


@pytest.fixture
def json_stream() -> Iterator[io.StringIO]:
    """configure_logging's JSON handler, writing to a buffer; the root restored after."""
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    configure_logging("json")
    stream = io.StringIO()
    handler = root.handlers[0]
    assert isinstance(handler, BackgroundStreamHandler)
    handler.setStream(stream)
    try:
        yield stream
    finally:
        handler.close()
        root.handlers[:] = saved
        root.setLevel(level)


def _only_json_handler() -> logging.Handler:
    """The JSON handler alone on the root (pytest adds its capture handler for each test's
    call, which makes log_access take its general path)."""
    root = logging.getLogger()
    [handler] = [h for h in root.handlers if isinstance(h, BackgroundStreamHandler)]
    root.handlers[:] = [handler]
    return handler


def test_log_access_writes_through_the_json_handler(json_stream: io.StringIO) -> None:
    handler = _only_json_handler()
    logger = logging.getLogger("gateway.rpc")
    for status in (200, 401, 500):
        log_access(logger, "GET /api/v1/key", status, 1.25, "rid-1")
    logging.getLogger("gateway.other").warning("after them")
    handler.flush()
    lines = [json.loads(line) for line in json_stream.getvalue().splitlines()]
    assert [line.get("status") for line in lines] == [200, 401, 500, None]
    assert lines[0]["message"] == "GET /api/v1/key 200 1.2 ms"
    assert lines[0]["request_id"] == "rid-1"
    assert lines[-1]["message"] == "after them"


def test_log_access_falls_back_to_the_logger_elsewhere(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("gateway.rpc")
    with caplog.at_level(logging.INFO, logger="gateway.rpc"):
        log_access(logger, "GET /api/v1/key", 200, 2.0, "rid-2")
    [record] = [r for r in caplog.records if r.name == "gateway.rpc"]
    assert record.getMessage() == "GET /api/v1/key 200 2.0 ms"
    assert (record.route, record.status, record.duration_ms) == ("GET /api/v1/key", 200, 2.0)  # type: ignore[attr-defined]


def test_nothing_is_built_below_the_level(json_stream: io.StringIO) -> None:
    handler = _only_json_handler()
    logging.getLogger().setLevel(logging.WARNING)
    log_access(logging.getLogger("gateway.rpc"), "GET /api/v1/key", 200, 1.0, None)
    handler.flush()
    assert json_stream.getvalue() == ""


def test_the_background_handler_keeps_every_line_in_order() -> None:
    stream = io.StringIO()
    handler = BackgroundStreamHandler(stream)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.Logger("ordered")
    logger.addHandler(handler)
    for index in range(5000):
        logger.warning("line %d", index)
    handler.flush()
    assert stream.getvalue().splitlines() == [f"line {i}" for i in range(5000)]
    handler.close()
    logger.warning("after close")  # the writer is gone: written in place
    assert stream.getvalue().splitlines()[-1] == "after close"
