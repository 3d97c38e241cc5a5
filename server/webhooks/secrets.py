"""A workspace's webhook signing secret (Standard Webhooks' `whsec_…`): its form. Stored
sealed, created on first use: server/vault/webhook_secrets.py."""

from __future__ import annotations

import base64
import secrets


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
