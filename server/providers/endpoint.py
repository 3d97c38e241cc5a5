"""One provider endpoint as the catalog names it: which adapter speaks to it, where, with which
credential and model name. What every adapter is handed; the catalog (server/routing) builds
them."""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Endpoint:
    provider: str  # provider slug: selects provider.options[slug]
    adapter: str
    base_url: str | None = None
    api_key_env: str | None = None
    secret_key_env: str | None = None  # a second credential, for providers that sign with two
    model: str | None = None  # the provider's own model name
    timeout_seconds: float = 120.0
    api_version: str | None = None  # a versioned API's version (Azure OpenAI's api-version)
    # A workspace's own provider key (BYOK), set by replacing the endpoint
    # (dataclasses.replace): it comes before the operator's credential. Never in a repr.
    byok_credential: str | None = field(default=None, repr=False, compare=False)
    byok_secret: str | None = field(default=None, repr=False, compare=False)

    def credential(self) -> str | None:
        if self.byok_credential is not None:
            return self.byok_credential
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    def secret(self) -> str | None:
        if self.byok_secret is not None:
            return self.byok_secret
        return os.environ.get(self.secret_key_env) if self.secret_key_env else None

    @property
    def is_byok(self) -> bool:
        """Whether this attempt uses a workspace's own key (billed by the provider to it)."""
        return self.byok_credential is not None

    @property
    def available(self) -> bool:
        """An endpoint that needs credentials is usable only when they are configured."""
        return not self.missing_credentials()

    def missing_credentials(self) -> tuple[str, ...]:
        """The names (never the values) of the environment variables this endpoint needs and
        that are not set: what the operator must configure before it can be routed to."""
        missing = []
        if self.api_key_env is not None and not self.credential():
            missing.append(self.api_key_env)
        if self.secret_key_env is not None and not self.secret():
            missing.append(self.secret_key_env)
        return tuple(missing)
