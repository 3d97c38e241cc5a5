"""The one pooled provider client keeps no cookies: what a provider's answer to one
workspace's request sets is never sent with the next request, whoever makes it."""

from __future__ import annotations

import httpx

from server.providers.http import no_cookies


async def test_a_cookie_set_by_a_provider_is_not_sent_back() -> None:
    seen: list[str | None] = []

    def provider(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("cookie"))
        return httpx.Response(
            200,
            headers=[
                ("set-cookie", "session=workspace-a; Path=/"),
                ("set-cookie", "AWSALB=sticky; Path=/; Domain=api.provider.test"),
            ],
            json={"text": "ok"},
        )

    async with httpx.AsyncClient(
        transport=httpx.MockTransport(provider), cookies=no_cookies()
    ) as client:
        for _ in range(3):
            response = await client.post("https://api.provider.test/v1/audio/transcriptions")
            assert response.status_code == 200
        assert len(client.cookies.jar) == 0
    assert seen == [None, None, None]


async def test_a_default_client_would_send_it_back() -> None:
    """The failure the jar prevents: httpx's default jar keeps the cookie for the host."""
    seen: list[str | None] = []

    def provider(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("cookie"))
        return httpx.Response(200, headers=[("set-cookie", "session=workspace-a; Path=/")])

    async with httpx.AsyncClient(transport=httpx.MockTransport(provider)) as client:
        for _ in range(2):
            await client.post("https://api.provider.test/v1/audio/transcriptions")
    assert seen == [None, "session=workspace-a"]
