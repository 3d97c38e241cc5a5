"""Structured logs: one JSON object per line on stderr, each carrying the id of the request
it belongs to (Envoy's x-request-id, or one made up for a direct gRPC call)."""

from __future__ import annotations

import collections
import json
import logging
import os
import re
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from contextvars import ContextVar
from datetime import UTC, datetime
from json.encoder import encode_basestring
from typing import Any, TextIO

# The request the current task serves; each gRPC call runs in a task of its own.
REQUEST_ID: ContextVar[str | None] = ContextVar("request_id", default=None)

# Attributes every LogRecord has; anything else came in through `extra=` and is logged too.
_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "request_id"}
LOG_FORMATS = ("json", "text")


# Secrets that must never be written, whatever logged them: our API keys and the operator
# key, bearer tokens of
# any kind (a BYOK key in an Authorization header), webhook signing secrets.
_SECRETS = (
    (re.compile(r"sk-gw-v1-[0-9A-Za-z]+"), "sk-gw-v1-[redacted]"),
    (re.compile(r"sk-gw-op-[0-9A-Za-z]+"), "sk-gw-op-[redacted]"),  # the operator key
    (re.compile(r"(?i)\b(bearer|basic)(\s+|\\x[0-9a-f]{2}|%20)+[^\s'\"]+"), r"\1 [redacted]"),
    (re.compile(r"whsec_[A-Za-z0-9+/=]+"), "whsec_[redacted]"),
)


# Where any of them starts (a wider net is fine): one scan of literals (far cheaper than the
# patterns joined into one) clears a line that has none, nearly every line. A pattern added
# above needs its start here: tests/unit/test_log_redaction.py fails until it has.
_ANY_SECRET = re.compile(r"sk-gw-|whsec_|(?i:bearer|basic)")


def may_hold_secret(text: str) -> bool:
    """Whether `text` holds where a secret pattern starts (_ANY_SECRET finds one). An ASCII
    line (nearly every line) is searched for the literals themselves, lowercased for the
    case-free ones: C substring searches, much cheaper than the regex's scan.
    Other text goes through the regex, whose IGNORECASE also takes non-ASCII look-alikes
    (U+017F for s, U+0131 for i) that lowercasing would not."""
    if text.isascii():
        lowered = text.lower()
        return "sk-gw-" in text or "whsec_" in text or "bearer" in lowered or "basic" in lowered
    return _ANY_SECRET.search(text) is not None


def redact(text: str) -> str:
    """`text` with every secret-shaped run replaced (the last line of defence: nothing
    should log a secret in the first place)."""
    if not may_hold_secret(text):
        return text
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text


class GrpcMetadataFilter(logging.Filter):
    """grpc's own Python loggers (`grpc._cython.cygrpc`, `grpc._server`, …) print a request's
    metadata value when it is not valid UTF-8 — an Authorization header with a stray byte
    becomes three error lines carrying the whole API key, with a traceback. Such a line is
    the client's mistake, not the server's: it is kept as one warning without the value."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("grpc"):
            return True
        message = str(record.msg)
        if "Invalid encoding" in message or "metadata" in message.lower():
            record.msg = "a request carried a metadata value that is not valid UTF-8 (withheld)"
            record.args = ()
            record.exc_info = None
            record.exc_text = None
            record.stack_info = None
            if record.levelno > logging.WARNING:
                record.levelno, record.levelname = logging.WARNING, "WARNING"
            return True
        # Anything else grpc logs: its text redacted, its traceback without values.
        record.msg = redact(record.getMessage())
        record.args = ()
        return True


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get()
        return True


_ENCODER = json.JSONEncoder(default=str, ensure_ascii=False)
_json_string = encode_basestring  # a str as JSON with ensure_ascii=False (C-accelerated)


class JsonFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        self._second = -1  # the whole second of the last line, and its text up to the "."
        self._second_text = ""

    def _time(self, created: float) -> str:
        """RFC 3339 UTC with milliseconds; the date and time of day are formatted once per
        second (most lines share theirs with the line before)."""
        second = int(created)
        micros = round((created - second) * 1_000_000)  # as datetime.fromtimestamp rounds
        if micros >= 1_000_000:
            second, micros = second + 1, micros - 1_000_000
        if second != self._second:
            text = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
            self._second, self._second_text = second, text
        return f"{self._second_text}{micros // 1000:03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self._time(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id:
            entry["request_id"] = request_id
        fields = record.__dict__
        for name in sorted(fields.keys() - _STANDARD):  # what came in through `extra=`
            if not name.startswith("_"):
                entry[name] = fields[name]
        if record.exc_info:
            entry["exception"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        return redact(_ENCODER.encode(entry))

    def access_line(
        self,
        logger: str,
        created: float,
        route: str,
        status: int,
        duration_ms: float,
        request_id: str | None,
    ) -> str:
        """The line format() makes of log_access's record, written out directly: the same
        members in the same order, each encoded as the JSON encoder would."""
        message = f"{route} {status} {duration_ms:.1f} ms"
        request = f'"request_id": {_json_string(request_id)}, ' if request_id else ""
        return redact(
            f'{{"time": "{self._time(created)}", "level": "info", '
            f'"logger": {_json_string(logger)}, "message": {_json_string(message)}, {request}'
            # A finite float is written as its repr by the JSON encoder too.
            f'"duration_ms": {float(duration_ms)!r}, "route": {_json_string(route)}, '
            f'"status": {int(status)}}}'
        )


# Lines formatted but not yet written, past which the logging call writes them itself (and
# waits for the stream, as every call did before): only when whoever reads stderr is slow.
MAX_PENDING_LINES = 10_000
# How often the writer looks for lines: a line reaches stderr at most this late, and a busy
# server writes the lines of that time in one system call.
WRITE_INTERVAL_SECONDS = 0.02


class BackgroundStreamHandler(logging.StreamHandler[TextIO]):
    """A StreamHandler whose writes are made by a thread of its own. A line is formatted
    (and redacted) where it is logged, so it says what was true then, and queued; the
    write to stderr — a system call per line, a fifth of GET /key's CPU when it was made on
    the event loop for each access line — is made by the writer, for every line that
    gathered in WRITE_INTERVAL_SECONDS at once. Logging a line costs an append: the writer
    wakes on its own timer, as waking it from the event loop (a futex wake, and often a
    switch of threads) cost more than the append. flush() (and so logging.shutdown at
    exit) writes whatever is still queued."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self._pending: collections.deque[str] = collections.deque()
        self._write_lock = threading.Lock()  # one writer at a time: lines keep their order
        self._stop_writer = threading.Event()
        self._writer = threading.Thread(target=self._write_lines, name="log-writer", daemon=True)
        self._writer.start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + self.terminator
        except Exception:
            self.handleError(record)
            return
        self.enqueue(line)

    def enqueue(self, line: str) -> None:
        """Queue a formatted line (ending with the terminator) for the writer."""
        self._pending.append(line)
        if len(self._pending) > MAX_PENDING_LINES or not self._writer.is_alive():
            self._drain()

    def _write_lines(self) -> None:
        while not self._stop_writer.wait(WRITE_INTERVAL_SECONDS):
            self._drain()

    def _drain(self) -> None:
        with self._write_lock:
            lines = []
            while True:
                try:
                    lines.append(self._pending.popleft())
                except IndexError:
                    break
            if not lines:
                return
            try:
                self.stream.write("".join(lines))
                self.stream.flush()
            except Exception:  # a closed stderr, its reader gone: nowhere to say so
                pass

    def flush(self) -> None:
        """Write every line emitted before the call."""
        self._drain()
        super().flush()

    def close(self) -> None:
        """Write what is pending, then stop the writer."""
        self._stop_writer.set()
        if self._writer.is_alive() and threading.current_thread() is not self._writer:
            self._writer.join()
        self._drain()
        super().close()


def _direct_handler(logger: logging.Logger) -> BackgroundStreamHandler | None:
    """The handler a record of `logger` would reach, when that is configure_logging's JSON
    handler alone, with nothing on the way that could change or drop the record."""
    node: logging.Logger | None = logger
    while node is not None and node is not logging.root:
        if node.handlers or node.filters or not node.propagate:
            return None
        node = node.parent
    handlers = logging.root.handlers
    if logging.root.filters or len(handlers) != 1:
        return None
    handler = handlers[0]
    if (
        type(handler) is not BackgroundStreamHandler
        or type(handler.formatter) is not JsonFormatter
        or handler.level > logging.INFO
        or not all(type(f) in _OWN_FILTERS for f in handler.filters)
    ):
        return None
    return handler


def log_access(
    logger: logging.Logger,
    route: str,
    status: int,
    duration_ms: float,
    request_id: str | None,
) -> None:
    """One rpc's access line: `logger.info("%s %s %.1f ms", route, status, duration_ms,
    extra={"route", "status", "duration_ms"})` carrying `request_id`. With the JSON handler
    configure_logging installs, the line is built and queued directly (what the logging
    machinery would produce; its record, filters and generic formatting cost more than the
    line itself, on every request); otherwise it is logged as that call."""
    if not logger.isEnabledFor(logging.INFO):
        return
    handler = _direct_handler(logger)
    if handler is None:
        logger.info(
            "%s %s %.1f ms",
            route,
            status,
            duration_ms,
            extra={"route": route, "status": status, "duration_ms": duration_ms},
        )
        return
    formatter = handler.formatter
    assert isinstance(formatter, JsonFormatter)  # _direct_handler checked it
    line = formatter.access_line(logger.name, time.time(), route, status, duration_ms, request_id)
    handler.enqueue(line + handler.terminator)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


_OWN_FILTERS = (RequestIdFilter, GrpcMetadataFilter)  # neither changes an access line


def configure_logging(log_format: str = "json", level: int = logging.INFO) -> None:
    """Route every logger to stderr in `log_format` (json, or text for a terminal)."""
    handler = BackgroundStreamHandler(sys.stderr)
    handler.addFilter(RequestIdFilter())
    handler.addFilter(GrpcMetadataFilter())
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            TextFormatter("%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s")
        )
    # No line shows the thread or the process: not collected for every record (the logging
    # HOWTO's "Optimization", through its public switches).
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    root = logging.getLogger()
    for previous in root.handlers:  # configured again (tests): stop the old writer
        if isinstance(previous, BackgroundStreamHandler):
            previous.close()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("alembic", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def configure_logging_from_environment(env: Mapping[str, str] = os.environ) -> None:
    """GATEWAY_LOG_FORMAT (json, the default, or text)."""
    log_format = env.get("GATEWAY_LOG_FORMAT", "json")
    configure_logging(log_format if log_format in LOG_FORMATS else "json")
