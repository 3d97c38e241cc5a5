"""503s that know when to retry say so: an unreachable database (the monitor's next check
plus Envoy's health check) as Retry-After on REST and RetryInfo on gRPC; Envoy's own 503 (no
server in rotation) with the health check's interval."""

from __future__ import annotations

from google.rpc import error_details_pb2

from facade.envoy_config import _local_reply_config
from server.errors import UNAVAILABLE_RETRY_SECONDS, GatewayError
from server.observability.monitor import recovery_retry_seconds
from server.services.rpc import failure_error, rich_status


def test_an_unreachable_database_is_503_with_retry_after_and_retry_info() -> None:
    seconds = recovery_retry_seconds(0.3)
    assert seconds == 1 + UNAVAILABLE_RETRY_SECONDS
    error = failure_error(ConnectionError("refused"), seconds)
    assert (error.status, error.response_headers()) == (503, {"retry-after": str(seconds)})
    retry = [d for d in rich_status(error).details if d.Is(error_details_pb2.RetryInfo.DESCRIPTOR)]
    assert len(retry) == 1
    info = error_details_pb2.RetryInfo()
    retry[0].Unpack(info)
    assert info.retry_delay.seconds == seconds


def test_other_failures_keep_their_own_error() -> None:
    own = GatewayError(409, "Conflict")
    assert failure_error(own, 5) is own
    assert failure_error(ValueError("bug"), 5).status == 500
    assert failure_error(ValueError("bug"), 5).retry_after_seconds is None


def test_envoys_own_503_carries_retry_after() -> None:
    headers = {
        h["header"]["key"]: h["header"]["value"]
        for m in _local_reply_config()["mappers"]
        if m.get("body", {}).get("inline_string") == "Service temporarily unavailable"
        for h in m.get("headers_to_add", [])
    }
    assert headers == {"retry-after": str(UNAVAILABLE_RETRY_SECONDS)}
