"""The headers a webhook delivery carries: OpenRouter's signature (so receivers written for
OpenRouter verify ours unchanged) and Standard Webhooks' (via the `standardwebhooks`
library), both under the workspace's one signing secret.

OpenRouter (https://openrouter.ai/docs/cookbook/video-generation/video-generation-webhooks):
`X-OpenRouter-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>,<raw body>">`, keyed
with the signing secret exactly as the workspace settings show it (the documented receiver
passes the configured string to `createHmac` as is: here the whole `whsec_…` text, UTF-8),
and `X-OpenRouter-Idempotency-Key: <job id>-<status>`, one per job outcome across retries.
Standard Webhooks keys with the bytes the `whsec_` base64 decodes to; the library does that."""

from __future__ import annotations

import hashlib
import hmac
from datetime import datetime

from standardwebhooks import Webhook

OPENROUTER_SIGNATURE = "x-openrouter-signature"
OPENROUTER_IDEMPOTENCY_KEY = "x-openrouter-idempotency-key"


def openrouter_signature(secret: str, timestamp: int, body: bytes) -> str:
    """The `X-OpenRouter-Signature` value for `body` sent at `timestamp` (unix seconds)."""
    signed = str(timestamp).encode() + b"," + body
    digest = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def idempotency_key(job_id: str, status: str) -> str:
    return f"{job_id}-{status}"


def signature_headers(
    secret: str, message_id: str, sent_at: datetime, payload: str, *, job_id: str, status: str
) -> dict[str, str]:
    """Both header sets for one send of a delivery (re-signed at each attempt)."""
    sent_at = sent_at.replace(microsecond=0)
    timestamp = int(sent_at.timestamp())
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": Webhook(secret).sign(message_id, sent_at, payload),
        OPENROUTER_SIGNATURE: openrouter_signature(secret, timestamp, payload.encode()),
        OPENROUTER_IDEMPOTENCY_KEY: idempotency_key(job_id, status),
    }
