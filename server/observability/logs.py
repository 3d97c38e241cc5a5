"""Structured logs: one JSON object per line on stderr, each carrying the id of the request
it belongs to (Envoy's x-request-id, or one made up for a direct gRPC call)."""

from __future__ import annotations

import json
import logging
import os
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
        for name, value in record.__dict__.items():
            if name not in _STANDARD and not name.startswith("_"):
                entry[name] = value
        if record.exc_info:
            entry["exception"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        return json.dumps(entry, default=str, ensure_ascii=False)


def configure_logging(log_format: str = "json", level: int = logging.INFO) -> None:
    """Route every logger to stderr in `log_format` (json, or text for a terminal)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RequestIdFilter())
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("alembic", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def configure_logging_from_environment(env: Mapping[str, str] = os.environ) -> None:
    """GATEWAY_LOG_FORMAT (json, the default, or text)."""
    log_format = env.get("GATEWAY_LOG_FORMAT", "json")
    configure_logging(log_format if log_format in LOG_FORMATS else "json")
