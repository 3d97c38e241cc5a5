"""Talking HTTP to providers over the one pooled client, in one place: the credential header;
sending, where transport failures and a provider's HTTP failure (read by the provider's own
rules) become ProviderFailures in the gateway's words; reading JSON answers; and fetching the
URLs someone else named — a provider's result file (`Downloads`) and a client's image
(`ImageFetcher`) — only after the DNS-pinned address check webhooks use
(server/webhooks/targets.py)."""

from __future__ import annotations

import asyncio
import base64
import binascii
import email.utils
import http.cookiejar
import logging
import math
import os
import re
import ssl
from collections.abc import AsyncGenerator, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache, partial
from typing import Any
from urllib.parse import unquote_to_bytes, urljoin, urlsplit
from urllib.request import getproxies

import httpx

from server.config import VIDEO_IMAGE_FETCH_SECONDS, VIDEO_IMAGE_MAX_BYTES
from server.providers.endpoint import Endpoint
from server.providers.failures import (
    CLIENT_ERROR,
    INVALID_RESPONSE,
    OVERLOADED,
    RATE_LIMITED,
    REJECTED_CREDENTIALS,
    SERVER_ERROR,
    TIMEOUT,
    UNREACHABLE,
    ProviderFailure,
)
from server.providers.transport import Http11Transport
from server.webhooks.targets import (
    Lookup,
    RefusedTarget,
    ResolvedTarget,
    UnresolvedTarget,
    dns_lookup,
    resolve_target,
)

MAX_PROVIDER_MESSAGE = 300  # how much of a provider's own message is repeated
# What a provider's error body says: its error code and message. Each provider has its own
# shape; the default reads OpenAI's ({"error": {"code", "message"}} or {"error": "..."}).
ErrorFields = tuple[str | int | None, str]
ErrorReader = Callable[[httpx.Response], ErrorFields]
# A provider's HTTP error (status >= 400) as a failure; each provider's documented codes decide.
FailureOf = Callable[[httpx.Response], ProviderFailure]

_WORDS = {
    RATE_LIMITED: "Provider rate limited the request",
    OVERLOADED: "Provider is overloaded",
    REJECTED_CREDENTIALS: "Provider refused the gateway's credentials",
    TIMEOUT: "Provider timed out",
    SERVER_ERROR: "Provider returned error",
}
_BAD_URL = "Provider returned a bad video URL"
_HTTPX_LOG = logging.getLogger("httpx")  # the logger httpx's own send writes its line to

# What a multipart name or file name cannot carry as is (WHATWG's multipart/form-data
# encoding, as httpx applies it): the quote, the backslash, and the control characters but
# ESC, percent-encoded; so a client's file name never ends the header line it is in.
_FORM_PARAM_ESCAPES = {
    '"': "%22",
    "\\": "\\\\",
    **{chr(code): f"%{code:02X}" for code in range(0x20) if code != 0x1B},
}
_FORM_PARAM_SPECIAL = re.compile("|".join(re.escape(c) for c in _FORM_PARAM_ESCAPES))


def _form_param(name: str, value: str) -> bytes:
    escaped = _FORM_PARAM_SPECIAL.sub(lambda match: _FORM_PARAM_ESCAPES[match.group(0)], value)
    return f'{name}="{escaped}"'.encode()


def multipart_form(
    fields: Iterable[tuple[str, str]],
    file_field: str,
    filename: str,
    content: bytes,
    content_type: str,
    boundary: bytes | None = None,
) -> tuple[str, bytes]:
    """A multipart/form-data body in one piece — `fields` in order, then the file — and its
    Content-Type: the bytes httpx's own encoder writes for the same fields (same escaping,
    same layout; tests/unit/test_multipart_form.py compares them), built at a fraction of
    the CPU (its encoder walks objects per field; a provider call pays it every time)."""
    boundary = boundary or os.urandom(16).hex().encode("ascii")
    separator = b"--" + boundary + b"\r\nContent-Disposition: form-data; "
    pieces: list[bytes] = []
    for name, value in fields:
        pieces += (separator, _form_param("name", name), b"\r\n\r\n", value.encode(), b"\r\n")
    pieces += (separator, _form_param("name", file_field))
    if filename:
        pieces += (b"; ", _form_param("filename", filename))
    pieces += (b"\r\nContent-Type: ", content_type.encode(), b"\r\n\r\n", content)
    pieces += (b"\r\n--", boundary, b"--\r\n")
    return f"multipart/form-data; boundary={boundary.decode('ascii')}", b"".join(pieces)


class _RefuseCookies(http.cookiejar.DefaultCookiePolicy):
    def set_ok(self, cookie: http.cookiejar.Cookie, request: Any) -> bool:
        return False

    def return_ok(self, cookie: http.cookiejar.Cookie, request: Any) -> bool:
        return False


class _NoCookieJar(http.cookiejar.CookieJar):
    """Reads no Set-Cookie header and stores nothing: cheaper per response than refusing
    each cookie by policy (the refusing policy stays as a second guard)."""

    def extract_cookies(self, response: Any, request: Any) -> None:
        return None

    def set_cookie(self, cookie: http.cookiejar.Cookie) -> None:
        return None

    def add_cookie_header(self, request: Any) -> None:
        return None


def no_cookies() -> http.cookiejar.CookieJar:
    """The cookie jar of the one pooled provider client: it keeps none. The client serves
    every workspace, so a cookie one provider response sets (a session, a load balancer's
    stickiness) must never be sent with another workspace's request."""
    return _NoCookieJar(policy=_RefuseCookies())


class _NoCookies(httpx.Cookies):
    """The client's cookies over `no_cookies()`: a response is not even looked at (httpx
    would build a urllib request per response for the jar to ignore, on every provider call:
    `python -m bench.provider_call` measures it)."""

    def extract_cookies(self, response: httpx.Response) -> None:
        return None


# Distinct str URLs are few but for download and webhook URLs: their parsed form is kept
# (httpx parses a str URL on every build_request; an httpx.URL it takes as it is).
_URLS_KEPT = 512


@lru_cache(maxsize=_URLS_KEPT)
def parsed_url(url: str) -> httpx.URL:
    """`url` parsed by httpx, once per distinct URL (immutable: one serves every request)."""
    return httpx.URL(url)


class _CookielessClient(httpx.AsyncClient):
    """httpx's client whose cookies are always `_NoCookies`, whatever is set (its public
    `cookies` property, overridden). Everything else is httpx's own.

    `direct` is the transport every request of this client goes to when nothing else can
    take part in a send: no auth, no event hooks, no redirects followed, no cookies, and no
    proxy in the environment (httpx mounts one per proxy variable, read through
    urllib's `getproxies` as httpx reads them). `send` below then hands a built request to
    it through the public transport interface instead of the client's send, whose layers
    (auth flow, redirect loop, hooks, cookie extraction, response wrapping) would do
    nothing here but cost their CPU on every provider call."""

    def __init__(self, *, direct: httpx.AsyncBaseTransport | None = None, **kwargs: Any) -> None:
        self._no_cookies = _NoCookies(no_cookies())
        super().__init__(**kwargs)
        nothing_else = (
            not kwargs.get("follow_redirects")
            and kwargs.get("auth") is None
            and not kwargs.get("event_hooks")
            and not kwargs.get("mounts")
            and kwargs.get("proxy") is None
            and not (kwargs.get("trust_env", True) and _proxies_in_environment())
        )
        self.direct = direct if nothing_else else None

    @property
    def cookies(self) -> httpx.Cookies:
        return self._no_cookies

    @cookies.setter
    def cookies(self, cookies: Any) -> None:  # nothing is kept, whatever is set
        self._no_cookies = _NoCookies(no_cookies())


def _proxies_in_environment() -> bool:
    """Whether httpx would mount a proxy from the environment (it reads urllib's
    `getproxies`, keeping the http, https and all entries)."""
    return any(scheme in getproxies() for scheme in ("http", "https", "all"))


# The one pooled client's timeouts and pool (a provider's own timeout is set per request).
PROVIDER_TIMEOUT = httpx.Timeout(120.0, connect=10.0)
PROVIDER_LIMITS = httpx.Limits(max_connections=256, max_keepalive_connections=64)


def provider_client(
    tls: ssl.SSLContext,
    *,
    limits: httpx.Limits = PROVIDER_LIMITS,
    timeout: httpx.Timeout | float = PROVIDER_TIMEOUT,
    transport: str = "gateway",
) -> httpx.AsyncClient:
    """The one pooled client of provider calls, downloads and webhooks: TLS verified with
    `tls`, no redirects followed, no cookies kept, over the gateway's own HTTP/1.1 transport
    (server/providers/transport.py; the figures beside httpx's and aiohttp's are in the
    README's design notes, from `python -m bench.provider_call`). `transport` "httpx" or
    "aiohttp" puts httpx's default transport or aiohttp's (httpx-aiohttp) under the same
    client instead, to measure them (Settings.provider_transport)."""
    chosen: httpx.AsyncBaseTransport | None = None
    if transport == "gateway":
        chosen = Http11Transport(tls, limits)
    elif transport == "httpx":
        pass  # httpx's own, made by the client from the same settings
    elif transport == "aiohttp":
        try:
            from httpx_aiohttp import AiohttpTransport  # optional: the `bench` extra
        except ImportError as exc:
            raise ValueError(
                "provider transport 'aiohttp' needs httpx-aiohttp: pip install '.[bench]'"
            ) from exc
        chosen = AiohttpTransport(verify=tls, limits=limits, trust_env=False)
    else:
        raise ValueError(f"unknown provider transport {transport!r}")
    return _CookielessClient(
        verify=tls,
        timeout=timeout,
        limits=limits,
        follow_redirects=False,
        cookies=no_cookies(),  # one client for every workspace: no cookie carries over
        transport=chosen,
        direct=chosen,
    )


def retry_after_seconds(value: str | None, now: datetime | None = None) -> int | None:
    """Retry-After as whole seconds (delta-seconds or an HTTP date); None when absent/bad."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return int(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    delta = (when - (now or datetime.now(UTC))).total_seconds()
    return max(0, int(delta + 0.999))


def retry_hint(response: httpx.Response) -> int | None:
    """Seconds to wait: Retry-After, or Azure's documented retry-after-ms."""
    seconds = retry_after_seconds(response.headers.get("retry-after"))
    millis = response.headers.get("retry-after-ms", "").strip()
    if seconds is None and millis.isdigit():
        seconds = math.ceil(int(millis) / 1000)
    return seconds


def http_failure(
    kind: str,
    response: httpx.Response,
    provider_code: str | int | None,
    message: str = "",
    retry_after: int | None = None,
) -> ProviderFailure:
    """A provider's HTTP failure of `kind` (which the provider's own codes decide), in the
    gateway's words: only a refused request repeats what the provider said, bounded. A rate
    limit or overload carries `retry_after`, else the response's retry hint."""
    if kind == CLIENT_ERROR:
        said = message[:MAX_PROVIDER_MESSAGE]
        words = (
            f"Provider rejected the request: {said}" if said else "Provider rejected the request"
        )
    else:
        words = _WORDS[kind]
    if retry_after is None and kind in (RATE_LIMITED, OVERLOADED):
        retry_after = retry_hint(response)
    return ProviderFailure(
        kind,
        words,
        status=response.status_code,
        provider_code=provider_code,
        retry_after=retry_after,
    )


def json_or_none(response: httpx.Response) -> dict[str, Any] | None:
    """The response's JSON object; None when the body is not one."""
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def json_object(response: httpx.Response) -> dict[str, Any]:
    """A provider's answer, which must be a JSON object."""
    body = json_or_none(response)
    if body is None:
        raise ProviderFailure(INVALID_RESPONSE, "Provider returned an invalid response")
    return body


def error_fields(code: object, message: object) -> ErrorFields:
    """What an error body said, whatever the provider's shape: a string or number code (else
    None) and a string message (else ""), bounded."""
    return (
        code if isinstance(code, str | int) else None,
        message[:MAX_PROVIDER_MESSAGE] if isinstance(message, str) else "",
    )


def openai_error(response: httpx.Response) -> ErrorFields:
    """OpenAI's error body: `{"error": {"code" or "type", "message"}}` or `{"error": "..."}`."""
    error = (json_or_none(response) or {}).get("error")
    if isinstance(error, dict):
        return error_fields(error.get("code") or error.get("type"), error.get("message"))
    return error_fields(None, error)


def failure_from_response(
    response: httpx.Response, read_error: ErrorReader = openai_error
) -> ProviderFailure:
    """The failure an HTTP status means for providers that say it with the status (OpenAI
    and most others), the body read by `read_error`."""
    status = response.status_code
    code, message = read_error(response)
    message = message[:MAX_PROVIDER_MESSAGE]
    if status == 429:
        kind = RATE_LIMITED
    elif status == 529 or (status == 503 and "overload" in message.lower()):
        kind = OVERLOADED
    elif status in (401, 403):
        kind = REJECTED_CREDENTIALS
    elif 400 <= status < 500 and status not in (408, 409, 425):
        kind = CLIENT_ERROR
    else:
        kind = SERVER_ERROR
    return http_failure(kind, response, code if code is not None else status, message)


def failure_reading(read_error: ErrorReader) -> FailureOf:
    """failure_from_response for a provider whose error body has its own shape."""
    return partial(failure_from_response, read_error=read_error)


def authorized(
    endpoint: Endpoint, headers: dict[str, str] | None = None, scheme: str = "Bearer"
) -> dict[str, str]:
    """The headers plus the endpoint's credential (read from its environment variable), as
    `Authorization: <scheme> <credential>`."""
    result = dict(headers or {})
    credential = endpoint.credential()
    if credential:
        result["Authorization"] = f"{scheme} {credential}"
    return result


async def send(
    http: httpx.AsyncClient,
    request: httpx.Request,
    failure_of: FailureOf = failure_from_response,
) -> httpx.Response:
    """Send one provider request; transport failures and HTTP errors (read by the
    provider's own `failure_of`) become ProviderFailures."""
    try:
        direct = http.direct if isinstance(http, _CookielessClient) else None
        if direct is None:
            response = await http.send(request)
        else:
            response = await _send_direct(direct, request)
    except httpx.TimeoutException as exc:
        raise ProviderFailure(TIMEOUT, "Provider timed out") from exc
    except httpx.TransportError as exc:
        raise ProviderFailure(UNREACHABLE, "Provider is unreachable") from exc
    if response.status_code >= 400:
        raise failure_of(response)
    return response


async def _send_direct(
    transport: httpx.AsyncBaseTransport, request: httpx.Request
) -> httpx.Response:
    """What the client's send does for a request no auth, hook, redirect, cookie or proxy
    takes part in: the transport's answer, read whole, closed if reading fails."""
    response = await transport.handle_async_request(request)
    response.request = request
    try:
        await response.aread()
    except BaseException:
        await response.aclose()
        raise
    return response


async def call(
    http: httpx.AsyncClient,
    endpoint: Endpoint,
    method: str,
    url: str,
    *,
    failure_of: FailureOf = failure_from_response,
    auth_scheme: str = "Bearer",
    **kwargs: Any,
) -> httpx.Response:
    """One request to the endpoint with its credential (`Authorization: <auth_scheme> ...`)."""
    request = http.build_request(
        method,
        parsed_url(url),
        headers=authorized(endpoint, kwargs.pop("headers", None), auth_scheme),
        timeout=endpoint.timeout_seconds,
        **kwargs,
    )
    return await send(http, request, failure_of)


def same_origin(url: object, base_url: str) -> bool:
    """Whether a URL from a provider's response lies under the endpoint's base URL (same
    scheme, host and port, below its path): only such URLs are called with the credential."""
    if not isinstance(url, str):
        return False
    got, base = urlsplit(url), urlsplit(base_url)
    prefix = base.path.rstrip("/") + "/"
    return (
        (got.scheme, got.netloc) == (base.scheme, base.netloc)
        and got.path.startswith(prefix)
        and ".." not in got.path.split("/")
        and not got.query
        and not got.fragment
    )


def _origin(url: str) -> tuple[str, str] | None:
    try:
        parts = urlsplit(url)
        return (parts.scheme, parts.netloc) if parts.hostname else None
    except ValueError:
        return None


class CheckedFetcher:
    """Fetches URLs someone else named over the one client: each only after resolve_target
    (https, public addresses unless `allow_private`), at the address it was checked at."""

    def __init__(
        self, http: httpx.AsyncClient, *, allow_private: bool = False, lookup: Lookup = dns_lookup
    ) -> None:
        self._http = http
        self._allow_private = allow_private
        self._lookup = lookup

    async def _target(self, url: str) -> ResolvedTarget:
        return await resolve_target(url, allow_private=self._allow_private, lookup=self._lookup)

    def _pinned_get(
        self,
        target: ResolvedTarget,
        timeout_seconds: float,
        headers: dict[str, str] | None = None,
    ) -> httpx.Request:
        """A GET at the checked address, the URL's name in Host and SNI."""
        return self._http.build_request(
            "GET",
            target.url,
            headers={**(headers or {}), "host": target.host_header},
            timeout=timeout_seconds,
            extensions={"sni_hostname": target.sni_hostname},
        )


# How much of a failed download's error body is read for its failure (the rest is dropped).
_ERROR_BODY_BYTES = 64 * 1024
_CHUNK = 64 * 1024


@dataclass(frozen=True)
class RemoteVideo:
    """A provider's result file, not fetched yet: `chunks()` fetches it as a stream of
    chunks (the video worker writes them into the content store under its size and time
    bounds), so no whole video is ever held in memory. Each call fetches it again."""

    downloads: Downloads
    endpoint: Endpoint
    url: str
    headers: dict[str, str] | None = field(default=None, repr=False)  # may hold a credential
    failure_of: FailureOf = failure_from_response
    origin: str | None = None

    def chunks(self) -> AsyncGenerator[bytes, None]:
        return self.downloads.stream(self)


class Downloads(CheckedFetcher):
    """Fetches the files a provider's answer points at (a finished video). A URL on the
    trusted origin — the endpoint's base URL, or another the adapter was configured with
    (Vertex's Cloud Storage) — is fetched as it is, with `headers` (a credential) when given.
    Any other URL (a CDN, signed storage) only over https to a public address, checked after
    DNS and pinned as webhook targets are (private ones only when the operator allows them),
    and never with `headers`: a credential stays on its own origin. One redirect is followed,
    under the same rules, without `headers`. The body is streamed, never read whole."""

    def remote(
        self,
        endpoint: Endpoint,
        url: object,
        *,
        headers: dict[str, str] | None = None,
        failure_of: FailureOf = failure_from_response,
        origin: str | None = None,
    ) -> RemoteVideo:
        """The result file at `url`, to be fetched by its `chunks()`."""
        if not isinstance(url, str):
            raise ProviderFailure(INVALID_RESPONSE, _BAD_URL)
        return RemoteVideo(self, endpoint, url, headers, failure_of, origin)

    async def stream(self, video: RemoteVideo) -> AsyncGenerator[bytes, None]:
        endpoint = video.endpoint
        trusted = _origin(video.origin or endpoint.base_url or "")
        timeout = endpoint.timeout_seconds
        url, failure_of = video.url, video.failure_of
        response = await self._open(url, trusted, video.headers, failure_of, timeout)
        try:
            if response.is_redirect:
                location = response.headers.get("location")
                await response.aclose()
                if not location:
                    raise ProviderFailure(INVALID_RESPONSE, "Provider redirected nowhere")
                try:
                    target = urljoin(url, location)
                except ValueError as exc:
                    raise ProviderFailure(INVALID_RESPONSE, _BAD_URL) from exc
                response = await self._open(target, trusted, None, failure_of, timeout)
                if response.is_redirect:
                    raise ProviderFailure(INVALID_RESPONSE, "Provider redirected too often")
            empty = True
            try:
                async for chunk in response.aiter_bytes(_CHUNK):
                    empty = False
                    yield chunk
            except httpx.TimeoutException as exc:
                raise ProviderFailure(TIMEOUT, "Provider timed out") from exc
            except httpx.TransportError as exc:
                raise ProviderFailure(UNREACHABLE, "Provider is unreachable") from exc
            if empty:
                raise ProviderFailure(INVALID_RESPONSE, "Provider returned an empty video")
        finally:
            await response.aclose()

    async def _open(
        self,
        url: str,
        trusted: tuple[str, str] | None,
        headers: dict[str, str] | None,
        failure_of: FailureOf,
        timeout_seconds: float,
    ) -> httpx.Response:
        """The answer's head, its body still to be read; an HTTP error as its failure (read
        from at most _ERROR_BODY_BYTES of its body)."""
        origin = _origin(url)
        # Asked for as it is: a compressed video gains nothing and its decoding costs.
        plain = {"accept-encoding": "identity"}
        if origin is not None and origin == trusted:
            request = self._http.build_request(
                "GET", url, headers={**plain, **(headers or {})}, timeout=timeout_seconds
            )
        elif headers:
            raise ProviderFailure(INVALID_RESPONSE, _BAD_URL)
        else:
            try:
                target = await self._target(url)
            except RefusedTarget as exc:
                raise ProviderFailure(INVALID_RESPONSE, _BAD_URL) from exc
            except UnresolvedTarget as exc:
                raise ProviderFailure(
                    UNREACHABLE, "Provider's video host cannot be resolved"
                ) from exc
            request = self._pinned_get(target, timeout_seconds, plain)
        try:
            response = await self._http.send(request, stream=True)
        except httpx.TimeoutException as exc:
            raise ProviderFailure(TIMEOUT, "Provider timed out") from exc
        except httpx.TransportError as exc:
            raise ProviderFailure(UNREACHABLE, "Provider is unreachable") from exc
        if response.status_code < 400:
            return response
        try:
            head = await _prefix(response, _ERROR_BODY_BYTES)
        finally:
            await response.aclose()
        raise failure_of(
            httpx.Response(
                response.status_code, headers=response.headers, content=head, request=request
            )
        )


async def _prefix(response: httpx.Response, limit: int) -> bytes:
    """At most `limit` bytes of a streamed body (what is left is not read)."""
    data = bytearray()
    try:
        async for chunk in response.aiter_bytes():
            data += chunk[: limit - len(data)]
            if len(data) >= limit:
                break
    except httpx.HTTPError:
        pass  # what arrived is enough to read the failure from
    return bytes(data)


@dataclass(frozen=True)
class InlineImage:
    data: bytes
    mime_type: str

    @property
    def base64(self) -> str:
        return base64.b64encode(self.data).decode("ascii")


def data_url_image(url: str) -> InlineImage | None:
    """The image a `data:` URL carries; None for an http(s) URL. A malformed data: URL is
    the client's fault."""
    if not url.startswith("data:"):
        return None
    header, sep, payload = url[5:].partition(",")
    if not sep:
        raise ProviderFailure(CLIENT_ERROR, "An image data: URL has no data")
    parts = header.split(";")
    mime_type = parts[0] or "image/png"
    try:
        if "base64" in parts[1:]:
            data = base64.b64decode(payload, validate=True)
        else:
            data = unquote_to_bytes(payload)
    except (binascii.Error, ValueError) as exc:
        raise ProviderFailure(CLIENT_ERROR, "An image data: URL is not valid base64") from exc
    if not mime_type.startswith("image/") or not data:
        raise ProviderFailure(CLIENT_ERROR, "An image data: URL does not hold an image")
    return InlineImage(data, mime_type)


class ImageFetcher(CheckedFetcher):
    """Fetches a client's image URL for providers that take images only inline (Veo).
    https only, to public addresses only (checked after DNS and pinned, as webhook targets
    are, so a name cannot point inside the gateway's network), no redirects, no
    credentials, at most `max_bytes` of an image/* type, the whole fetch within `seconds`
    (a host that trickles its answer fails it then, whatever the per-read timeouts). Every
    refusal is the client's fault: its message names the problem, never the URL."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        *,
        allow_private: bool = False,
        lookup: Lookup = dns_lookup,
        max_bytes: int = VIDEO_IMAGE_MAX_BYTES,
        seconds: float = VIDEO_IMAGE_FETCH_SECONDS,
    ) -> None:
        super().__init__(http, allow_private=allow_private, lookup=lookup)
        self._max_bytes = max_bytes
        self._seconds = seconds

    async def inline(self, url: str, timeout_seconds: float) -> InlineImage:
        image = data_url_image(url)
        if image is not None:
            return image
        try:
            async with asyncio.timeout(self._seconds):
                return await self._fetch(url, min(timeout_seconds, self._seconds))
        except TimeoutError:
            raise ProviderFailure(
                CLIENT_ERROR, f"An image URL did not answer within {self._seconds:g} s"
            ) from None

    async def _fetch(self, url: str, timeout_seconds: float) -> InlineImage:
        try:
            target = await self._target(url)
        except RefusedTarget as exc:
            raise ProviderFailure(
                CLIENT_ERROR, "An image URL must be a public https:// URL or a data: URL"
            ) from exc
        except UnresolvedTarget as exc:
            raise ProviderFailure(CLIENT_ERROR, "An image URL's host cannot be resolved") from exc
        request = self._pinned_get(target, timeout_seconds, {"accept": "image/*"})
        too_large = ProviderFailure(
            CLIENT_ERROR, f"An image is larger than the limit ({self._max_bytes} bytes)"
        )
        try:
            response = await self._http.send(request, stream=True)
            try:
                mime_type = response.headers.get("content-type", "").split(";")[0].strip()
                if response.status_code != 200 or not mime_type.startswith("image/"):
                    raise ProviderFailure(CLIENT_ERROR, "An image URL did not return an image")
                announced = response.headers.get("content-length", "")
                if announced.isdigit() and int(announced) > self._max_bytes:
                    raise too_large
                data = bytearray()
                async for chunk in response.aiter_bytes():
                    data += chunk
                    if len(data) > self._max_bytes:
                        raise too_large
            finally:
                await response.aclose()
        except httpx.HTTPError as exc:
            raise ProviderFailure(CLIENT_ERROR, "An image URL could not be fetched") from exc
        if not data:
            raise ProviderFailure(CLIENT_ERROR, "An image URL returned no data")
        return InlineImage(bytes(data), mime_type)
