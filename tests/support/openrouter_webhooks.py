"""A receiver's check of OpenRouter's webhook signature, written from OpenRouter's docs
(https://openrouter.ai/docs/cookbook/video-generation/video-generation-webhooks), not from
the gateway's signer: the same code docs/rest-api.md shows receivers."""

from __future__ import annotations

import hashlib
import hmac
import time


def verify_openrouter(secret: str, body: bytes, header: str, tolerance: int = 300) -> bool:
    parts = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    t, v1 = parts.get("t", ""), parts.get("v1", "")
    if not t.isdigit() or abs(time.time() - int(t)) > tolerance:
        return False
    expected = hmac.new(secret.encode(), f"{t},".encode() + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, v1)
