"""The provider client (server/providers/http.py) is httpx's client over the gateway's
transport: built and sent by the client's methods or by httpx.AsyncClient's, what reaches a
server is the same bytes and the Response is the same, and httpx's auth, event hooks,
redirects, streams, proxies and mounts all hold."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import itertools
import ssl
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest
import trustme

from server.providers.http import (
    _CookielessClient,
    multipart_form,
    no_cookies,
    provider_client,
)
from tests.unit.test_provider_transport import Server

LOOPBACK = "127.0.0.1"
JSON_ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Request-Id: abc\r\n"
    b'Content-Length: 16\r\n\r\n{"text": "done"}'
)


class Recorder:
    """A loopback HTTP/1.1 server that keeps the exact bytes of every request (its head and
    its Content-Length body) and answers each with `answer` (or what `answer` gives for the
    request): pieces written apart, a short pause between them. With TLS it keeps the server
    name each handshake asked for."""

    def __init__(
        self,
        answer: tuple[bytes, ...] | Callable[[bytes], tuple[bytes, ...]] = (JSON_ANSWER,),
        tls: bool = False,
        close: bool = False,
    ) -> None:
        self.answer = answer
        self.close = close  # the connection ends after each answer
        self.requests: list[bytes] = []
        self.server_names: list[str | None] = []
        self.client_tls: ssl.SSLContext = ssl.create_default_context()
        self._tls: ssl.SSLContext | None = None
        if tls:
            ca = trustme.CA()
            self._tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ca.issue_cert("provider.test", LOOPBACK).configure_cert(self._tls)
            self._tls.sni_callback = self._named
            ca.configure_trust(self.client_tls)
        self._server = Server(self._serve, tls=self._tls)

    def _named(self, _sock: Any, name: str | None, _context: Any) -> None:
        self.server_names.append(name)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            length = 0
            for line in head.lower().split(b"\r\n"):
                if line.startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            request = head + await reader.readexactly(length)
            self.requests.append(request)
            answer = self.answer(request) if callable(self.answer) else self.answer
            for index, piece in enumerate(answer):
                if index:
                    await asyncio.sleep(0.02)  # the rest arrives in a later read
                writer.write(piece)
                await writer.drain()
            if self.close:
                return

    @property
    def port(self) -> int:
        return self._server.port

    async def __aenter__(self) -> Recorder:
        await self._server.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._server.__aexit__(*exc)

    def url(self, path: str, scheme: str = "http") -> str:
        return f"{scheme}://{LOOPBACK}:{self.port}{path}"


async def exchange(
    client: httpx.AsyncClient, fast: bool, method: str, url: str | httpx.URL, **kwargs: Any
) -> httpx.Response:
    """One request built and sent by the client's own methods (`fast`) or by httpx's."""
    if fast:
        request = client.build_request(method, url, **kwargs)
        return await client.send(request)
    request = httpx.AsyncClient.build_request(client, method, url, **kwargs)
    return await httpx.AsyncClient.send(client, request)


def elapsed_or_none(response: httpx.Response) -> object:
    try:
        return response.elapsed is not None
    except RuntimeError:  # httpx: only once the response was read or closed by its stream
        return None


def assert_same_response(fast: httpx.Response, slow: httpx.Response) -> None:
    assert fast.status_code == slow.status_code
    assert fast.headers.raw == slow.headers.raw
    assert fast.content == slow.content
    assert fast.http_version == slow.http_version
    assert fast.reason_phrase == slow.reason_phrase
    assert fast.is_closed == slow.is_closed
    assert fast.is_stream_consumed == slow.is_stream_consumed
    assert fast.default_encoding == slow.default_encoding
    assert fast.history == slow.history == []
    assert elapsed_or_none(fast) == elapsed_or_none(slow)
    for got, want in ((fast.request, slow.request), (fast.next_request, slow.next_request)):
        if want is None:
            assert got is None
            continue
        assert got is not None
        assert (got.method, got.url, got.headers.raw) == (want.method, want.url, want.headers.raw)
        assert got.extensions == want.extensions
        assert got.read() == want.read()


@contextlib.asynccontextmanager
async def gateway_client(recorder: Recorder) -> AsyncIterator[httpx.AsyncClient]:
    async with provider_client(recorder.client_tls) as client:
        yield client


def multipart_kwargs() -> dict[str, Any]:
    content_type, body = multipart_form(
        [("model", "whisper-1"), ("language", "en")],
        "file",
        'a "quoted"\r\nname.wav',
        bytes(range(256)) * 40,
        "audio/wav",
        boundary=b"0123456789abcdef0123456789abcdef",
    )
    return {
        "content": body,
        "headers": {"Authorization": "Bearer sk-test", "Content-Type": content_type},
        "timeout": 30.0,
    }


# (a) and (b): the same bytes on the wire, the same Response -------------------------------

CASES: dict[str, tuple[str, str, Callable[[], dict[str, Any]]]] = {
    "multipart POST": ("POST", "/v1/audio/transcriptions", multipart_kwargs),
    "httpx's multipart POST": (
        "POST",
        "/v1/audio/transcriptions",
        lambda: {
            "data": {"model": "whisper-1"},
            "files": {"file": ("a.wav", b"RIFF....", "audio/wav")},
            "headers": {"Content-Type": "multipart/form-data; boundary=fixedboundary"},
        },
    ),
    "JSON POST with params": (
        "POST",
        "/v1/videos?dropped=1",
        lambda: {
            "json": {"model": "veo", "prompt": "a caf\u00e9 at dusk", "n": 1, "seed": None},
            "params": {"api-version": "2025-01-01", "k": ["1", "2"]},
            "headers": {"Authorization": "Bearer sk-test", "X-Trace": "t1"},
            "timeout": 12.5,
        },
    ),
    "GET with headers": (
        "GET",
        "/v1/videos/abc",
        lambda: {"headers": {"Accept": "application/json", "user-agent": "gateway/1"}},
    ),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_the_same_bytes_reach_the_server(case: str) -> None:
    method, path, kwargs = CASES[case]
    async with Recorder() as recorder, gateway_client(recorder) as client:
        fast = await exchange(client, True, method, recorder.url(path), **kwargs())
        slow = await exchange(client, False, method, recorder.url(path), **kwargs())
    assert len(recorder.requests) == 2
    assert recorder.requests[0] == recorder.requests[1]
    assert_same_response(fast, slow)
    assert fast.json() == {"text": "done"}


async def test_a_pinned_get_over_tls_sends_the_same_bytes_and_server_name() -> None:
    """As `CheckedFetcher._pinned_get` builds it: the checked address in the URL, the name in
    Host and in the `sni_hostname` extension."""
    kwargs = {
        "headers": {"accept": "image/*", "host": "provider.test", "X-Extra": "1"},
        "timeout": 5.0,
        "extensions": {"sni_hostname": "provider.test"},
    }
    responses = []
    async with Recorder(tls=True) as recorder:
        for fast in (True, False):  # a client each: each opens (and names) its connection
            async with gateway_client(recorder) as client:
                url = recorder.url("/files/a.png?sig=x", scheme="https")
                responses.append(await exchange(client, fast, "GET", url, **kwargs))
    assert recorder.server_names == ["provider.test", "provider.test"]
    assert recorder.requests[0] == recorder.requests[1]
    assert b"\r\nhost: provider.test\r\n" in recorder.requests[0]
    assert_same_response(*responses)


ANSWERS: dict[str, tuple[bytes, ...]] = {
    "in pieces, chunked": (
        b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
        b"6\r\n world\r\n0\r\n\r\n",
    ),
    "gzip": (
        b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: "
        + str(len(gzip.compress(b"squeezed"))).encode()
        + b"\r\n\r\n"
        + gzip.compress(b"squeezed"),
    ),
    "redirect": (b"HTTP/1.1 302 Found\r\nLocation: /elsewhere?x=1\r\nContent-Length: 0\r\n\r\n",),
    "HTTP/1.0, no length": (b"HTTP/1.0 404 Nope\r\nX-A: 1\r\n\r\nmissing",),
}


@pytest.mark.parametrize("answer", list(ANSWERS))
async def test_every_kind_of_answer_is_the_same_response(answer: str) -> None:
    responses = []
    async with Recorder(ANSWERS[answer], close=answer.startswith("HTTP/1.0")) as recorder:
        for fast in (True, False):
            async with gateway_client(recorder) as client:
                responses.append(
                    await exchange(client, fast, "POST", recorder.url("/v1/x"), content=b"{}")
                )
    assert_same_response(*responses)


@pytest.mark.parametrize(
    "location", [b"http://[::1", b"ftp://example.com/x", b"//other.example/p", b"?q=2"]
)
async def test_a_redirect_not_followed_is_alike(location: bytes) -> None:
    """httpx builds the redirect's request even when not following it (`next_request`), and
    refuses a Location that is no URL then: so does the short path."""
    answer = b"HTTP/1.1 301 Moved\r\nLocation: " + location + b"\r\nContent-Length: 0\r\n\r\n"
    outcomes: list[httpx.Response | type[BaseException]] = []
    async with Recorder((answer,)) as recorder:
        for fast in (True, False):
            async with gateway_client(recorder) as client:
                try:
                    outcomes.append(await exchange(client, fast, "GET", recorder.url("/v1/x#f")))
                except httpx.TransportError as exc:
                    assert exc.request.url == recorder.url("/v1/x#f")
                    outcomes.append(type(exc))
    ours, theirs = outcomes
    if isinstance(ours, httpx.Response) and isinstance(theirs, httpx.Response):
        assert_same_response(ours, theirs)
        assert ours.next_request is not None
    else:
        assert ours is theirs is httpx.RemoteProtocolError


async def test_transport_errors_name_the_request() -> None:
    async with Recorder() as recorder:
        pass  # closed: nothing listens on its port any more
    async with gateway_client(recorder) as client:
        request = client.build_request("GET", recorder.url("/v1/x"))
        with pytest.raises(httpx.ConnectError) as raised:
            await client.send(request)
    assert raised.value.request is request


async def test_a_closed_client_refuses_to_send() -> None:
    async with Recorder() as recorder:
        client = provider_client(recorder.client_tls)
        await client.aclose()
        with pytest.raises(RuntimeError):
            await client.send(client.build_request("GET", recorder.url("/v1/x")))


# build_request: the same Request as httpx's, whatever the arguments --------------------------


def same_request(client: httpx.AsyncClient, *args: Any, **kwargs: Any) -> None:
    ours = client.build_request(*args, **kwargs)
    theirs = httpx.AsyncClient.build_request(client, *args, **kwargs)
    assert (ours.method, ours.url) == (theirs.method, theirs.url)
    assert ours.headers.raw == theirs.headers.raw
    assert ours.headers.multi_items() == theirs.headers.multi_items()
    assert ours.extensions == theirs.extensions
    assert ours.content == theirs.content
    assert type(ours.stream) is type(theirs.stream)


URLS = [
    "http://a.example/x?y=1",
    httpx.URL("https://b.example:8443/p"),
    "https://user:pw@c.example/",
    "http://[::1]:8080/v",
    "/relative",
]
HEADERS: list[Any] = [
    None,
    {},
    {"Authorization": "Bearer x"},
    {"accept": "image/*", "host": "pinned.example"},
    {"USER-AGENT": "me", "content-length": "3", "Content-Type": "text/plain"},
    {"transfer-encoding": "chunked", "Connection": "close"},
    [("X-Twice", "1"), ("x-twice", "2")],
    {"X-Bytes": b"v"},
]
BODIES: list[dict[str, Any]] = [
    {},
    {"content": b"abc"},
    {"content": b""},
    {"content": "h\u00e9"},
    {"json": {"a": [1, "\u00e9"], "b": None}},
    {"json": {}},
    {"json": 0},
    {"content": b"x", "json": {"a": 1}},
    {"data": {"a": "1"}},
]


@pytest.mark.parametrize("method", ["GET", "post", "PUT", "PATCH", "DELETE", "HEAD"])
def test_build_request_is_httpx_s(method: str) -> None:
    client = provider_client(ssl.create_default_context())
    for url, headers, body, timeout, extensions, params in itertools.product(
        URLS,
        HEADERS,
        BODIES,
        [httpx.USE_CLIENT_DEFAULT, None, httpx.Timeout(5, connect=1)],
        [None, {"sni_hostname": "x"}, {"timeout": {"read": 1.0}}],
        [None, {"a": "1", "b": ["2", "3"]}],
    ):
        same_request(
            client,
            method,
            url,
            headers=headers,
            timeout=timeout,
            extensions=extensions,
            params=params,
            **body,
        )


def test_build_request_follows_later_changes_of_the_client() -> None:
    client = provider_client(ssl.create_default_context())
    client.headers["X-Client"] = "1"
    same_request(client, "POST", "http://a.example/", headers={"x-client": "2"}, content=b"a")
    same_request(client, "POST", "http://a.example/", content=b"a")
    client.headers = httpx.Headers({"Accept": "text/plain"})
    same_request(client, "GET", "http://a.example/", headers={"accept": "*/*"})
    client.params = httpx.QueryParams({"key": "v"})
    same_request(client, "GET", "http://a.example/?q=1", params={"b": "2"})
    with pytest.raises(UnicodeEncodeError):
        client.build_request("GET", "http://a.example/", headers={"X-Name": "caf\u00e9"})


# (c) where httpx's send would do more, it runs -------------------------------------------


class RecordingTransport(httpx.AsyncBaseTransport):
    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return httpx.Response(200, content=b"mounted")


@pytest.fixture
def no_env_proxies(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    yield monkeypatch


async def test_an_environment_proxy_is_honoured(no_env_proxies: pytest.MonkeyPatch) -> None:
    """A client whose transport httpx makes (trust_env): HTTP_PROXY mounts a proxy for
    http:// URLs, and the request goes to it, not to the default transport."""
    async with Recorder() as proxy:
        no_env_proxies.setenv("HTTP_PROXY", proxy.url(""))
        async with _CookielessClient(cookies=no_cookies()) as client:
            response = await client.send(client.build_request("GET", "http://provider.invalid/a"))
    assert response.json() == {"text": "done"}
    assert proxy.requests[0].startswith(b"GET http://provider.invalid/a HTTP/1.1\r\n")


async def test_a_mount_for_the_url_is_honoured() -> None:
    async with Recorder() as recorder:
        mounted = RecordingTransport()
        async with _CookielessClient(
            cookies=no_cookies(),
            transport=provider_client(recorder.client_tls)._transport,
            mounts={f"http://{LOOPBACK}:{recorder.port}": mounted},
        ) as client:
            response = await client.send(client.build_request("GET", recorder.url("/v1/x")))
            assert response.content == b"mounted"
            assert len(mounted.requests) == 1 and recorder.requests == []
            other = await client.send(client.build_request("GET", recorder.url("/v1/x", "http")))
            assert other.content == b"mounted"


async def test_event_hooks_fire() -> None:
    fired: list[str] = []

    async def on_request(request: httpx.Request) -> None:
        fired.append("request")

    async def on_response(response: httpx.Response) -> None:
        fired.append(f"response {response.status_code}")

    async with Recorder() as recorder, gateway_client(recorder) as client:
        client.event_hooks = {"request": [on_request], "response": [on_response]}
        await client.send(client.build_request("GET", recorder.url("/v1/x")))
        client.event_hooks = {"response": [on_response]}
        await client.send(client.build_request("GET", recorder.url("/v1/x")))
    assert fired == ["request", "response 200", "response 200"]


async def test_auth_of_the_client_the_call_or_the_url_is_httpx_s() -> None:
    basic = b"\r\nAuthorization: Basic dTpw\r\n"  # u:p
    async with Recorder() as recorder, gateway_client(recorder) as client:
        await client.send(client.build_request("GET", recorder.url("/v1/x")), auth=("u", "p"))
        url = f"http://u:p@{LOOPBACK}:{recorder.port}/v1/x"
        await client.send(client.build_request("GET", url))
        client.auth = ("u", "p")
        await client.send(client.build_request("GET", recorder.url("/v1/x")))
    assert all(basic in request for request in recorder.requests)


async def test_followed_redirects_and_streams_are_httpx_s() -> None:
    def answer(request: bytes) -> tuple[bytes, ...]:
        if request.startswith(b"GET /v1/x "):
            return (b"HTTP/1.1 307 Temporary\r\nLocation: /next\r\nContent-Length: 0\r\n\r\n",)
        return (JSON_ANSWER,)

    async with Recorder(answer) as recorder, gateway_client(recorder) as client:
        request = client.build_request("GET", recorder.url("/v1/x"))
        followed = await client.send(request, follow_redirects=True)
        assert followed.json() == {"text": "done"}
        assert [r.status_code for r in followed.history] == [307]
        assert recorder.requests[1].startswith(b"GET /next ")

        streamed = await client.send(
            client.build_request("GET", recorder.url("/v1/y")), stream=True
        )
        try:
            assert [part async for part in streamed.aiter_bytes()] == [b'{"text": "done"}']
        finally:
            await streamed.aclose()


# The transport's timeouts -------------------------------------------------------------


async def test_read_timeouts_hold_whatever_the_alarm_was_set_for() -> None:
    """One alarm per connection times its waits: a wait after a shorter one (the alarm set
    earlier) still runs to its own time, and one after a longer wait ends at its own."""

    def answer(request: bytes) -> tuple[bytes, ...]:
        return () if b" /silent " in request else (JSON_ANSWER,)

    loop = asyncio.get_running_loop()
    async with Recorder(answer) as recorder, gateway_client(recorder) as client:
        await exchange(client, True, "GET", recorder.url("/v1/x"), timeout=0.05)
        started = loop.time()
        with pytest.raises(httpx.ReadTimeout):
            await exchange(client, True, "GET", recorder.url("/silent"), timeout=0.4)
        assert loop.time() - started >= 0.39

        await exchange(client, True, "GET", recorder.url("/v1/x"), timeout=30.0)
        started = loop.time()
        with pytest.raises(httpx.ReadTimeout):
            await exchange(client, True, "GET", recorder.url("/silent"), timeout=0.1)
        assert 0.09 <= loop.time() - started < 5.0
