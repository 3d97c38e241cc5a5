"""The webhook signer: OpenRouter's header and Standard Webhooks' under one secret."""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime

import pytest
from standardwebhooks import Webhook

from server.webhooks.secrets import new_secret
from server.webhooks.signing import openrouter_signature, signature_headers
from tests.support.openrouter_webhooks import verify_openrouter

BODY = '{"type":"video.generation.completed","data":{"id":"vid_1","status":"completed"}}'


def test_openrouter_signature_is_hmac_of_timestamp_comma_body_keyed_by_the_secret_text() -> None:
    secret = "whsec_c2VjcmV0"
    # Computed by hand: HMAC-SHA256(key=b"whsec_c2VjcmV0", msg=b"1700000000," + body).
    expected = hmac.new(b"whsec_c2VjcmV0", b"1700000000," + BODY.encode(), "sha256")
    assert openrouter_signature(secret, 1700000000, BODY.encode()) == (
        f"t=1700000000,v1={expected.hexdigest()}"
    )
    # Not keyed with the decoded whsec_ bytes (that is Standard Webhooks' key).
    decoded = hmac.new(b"secret", b"1700000000," + BODY.encode(), hashlib.sha256).hexdigest()
    assert decoded not in openrouter_signature(secret, 1700000000, BODY.encode())


def test_both_header_sets_verify_and_reject_a_changed_body() -> None:
    secret = new_secret()
    sent_at = datetime.now(UTC)
    headers = signature_headers(secret, "msg_1", sent_at, BODY, job_id="vid_1", status="completed")
    assert headers["x-openrouter-idempotency-key"] == "vid_1-completed"
    assert headers["webhook-timestamp"] == str(int(sent_at.timestamp()))
    assert headers["x-openrouter-signature"].startswith(f"t={int(sent_at.timestamp())},v1=")
    assert verify_openrouter(secret, BODY.encode(), headers["x-openrouter-signature"])
    assert not verify_openrouter(secret, BODY.encode() + b" ", headers["x-openrouter-signature"])
    assert not verify_openrouter(new_secret(), BODY.encode(), headers["x-openrouter-signature"])
    assert Webhook(secret).verify(BODY, headers)["data"]["id"] == "vid_1"
    with pytest.raises(Exception):  # noqa: B017 (any verification failure)
        Webhook(secret).verify(BODY + " ", headers)


def test_a_stale_openrouter_timestamp_is_refused_by_the_receiver_check() -> None:
    secret = new_secret()
    old = openrouter_signature(secret, 1_000_000_000, BODY.encode())
    assert not verify_openrouter(secret, BODY.encode(), old)
