"""Structured logs: one JSON object per line on stderr, each carrying the id of the request
it belongs to (Envoy's x-request-id, or one made up for a direct gRPC call)."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import traceback
from collections.abc import Mapping
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

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


# Where any of them starts (a wider net is fine): one scan of literals (5 us; the patterns
# joined into one cost 40) clears a line that has none, nearly every line. A pattern added
# above needs its start here: tests/unit/test_log_redaction.py fails until it has.
_ANY_SECRET = re.compile(r"sk-gw-|whsec_|(?i:bearer|basic)")


def redact(text: str) -> str:
    """`text` with every secret-shaped run replaced (the last line of defence: nothing
    should log a secret in the first place)."""
    if _ANY_SECRET.search(text) is None:
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


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
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
        return redact(json.dumps(entry, default=str, ensure_ascii=False))


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def configure_logging(log_format: str = "json", level: int = logging.INFO) -> None:
    """Route every logger to stderr in `log_format` (json, or text for a terminal)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RequestIdFilter())
    handler.addFilter(GrpcMetadataFilter())
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            TextFormatter("%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s")
        )
    # No line shows the caller's file and line, the thread or the process: not collected
    # for every record (the logging HOWTO's "Optimization"; a quarter of an access line's cost).
    logging._srcfile = None  # documented there as the switch
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("alembic", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def configure_logging_from_environment(env: Mapping[str, str] = os.environ) -> None:
    """GATEWAY_LOG_FORMAT (json, the default, or text)."""
    log_format = env.get("GATEWAY_LOG_FORMAT", "json")
    configure_logging(log_format if log_format in LOG_FORMATS else "json")
