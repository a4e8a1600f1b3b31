"""The HTTP side of ``edgekit serve``, below the application: ASGI types, request headers,
the one responder of a request, refusals as OpenAI-style JSON errors
(``{"error": {"message", "type", "param", "code"}}``), and the lifespan protocol.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from edgekit.untrusted import clean_text

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = tuple[tuple[bytes, bytes], ...]


class Refusal(Exception):
    """A request the server answers with an error status (raised inside the app only)."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        *,
        param: str | None = None,
        headers: Headers = (),
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param
        self.headers = headers


class ClientGone(Exception):
    """The client closed the connection before its request was read."""


class RequestHeaders:
    """A request's headers by lower-case name; a repeated header that must be single
    (two Hosts, two API keys) is refused rather than guessed at."""

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self._values: dict[str, list[str]] = {}
        for key, value in raw:
            self._values.setdefault(key.decode("latin-1").lower(), []).append(
                value.decode("latin-1")
            )

    def one(self, name: str) -> str | None:
        values = self._values.get(name)
        if not values:
            return None
        if len(values) > 1:
            raise Refusal(400, f"the {name} header is repeated")
        return values[0]


def error_body(status: int, message: str, kind: str, param: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


class Responder:
    """Sends one response; ``extra`` headers (CORS) go on it, whatever it is.

    A client that stops reading (its socket buffers full) makes a send wait: after
    ``send_timeout`` it counts as gone (``stalled``), and nothing more is sent to it, so
    it cannot hold the one generation slot by reading slowly. The server then closes the
    connection, since the response was not completed."""

    def __init__(self, send: Send, send_timeout: float) -> None:
        self._send = send
        self._timeout = send_timeout
        self.extra: Headers = ()
        self.started = False
        self.stalled = False
        self.status: int | None = None  # the status sent, once the response has started

    async def _out(self, message: Message) -> None:
        if self.stalled:
            return
        try:
            await asyncio.wait_for(self._send(message), self._timeout)
        except TimeoutError:
            self.stalled = True

    async def start(self, status: int, headers: Headers) -> None:
        self.started = True
        self.status = status
        await self._out(
            {"type": "http.response.start", "status": status, "headers": [*headers, *self.extra]}
        )

    async def body(self, data: bytes, *, more: bool) -> None:
        await self._out({"type": "http.response.body", "body": data, "more_body": more})

    async def json(self, status: int, payload: Any, headers: Headers = ()) -> None:
        data = json.dumps(payload).encode()  # ASCII: a lone surrogate echoed back is escaped
        await self.start(
            status,
            (
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                *headers,
            ),
        )
        await self.body(data, more=False)

    async def text(self, status: int, data: str, content_type: str) -> None:
        body = data.encode("utf-8", "replace")
        await self.start(
            status,
            (
                (b"content-type", content_type.encode("ascii")),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-store"),
            ),
        )
        await self.body(body, more=False)

    async def empty(self, status: int, headers: Headers) -> None:
        await self.start(status, headers)
        await self.body(b"", more=False)

    async def error(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        *,
        param: str | None = None,
        headers: Headers = (),
    ) -> None:
        if self.started:  # too late for a status: the stream ends
            await self.body(b"", more=False)
            return
        await self.json(status, error_body(status, message, kind, param), headers)


def require_json(headers: RequestHeaders) -> None:
    value = headers.one("content-type") or ""
    media, *params = [p.strip().lower() for p in value.split(";")]
    charset_ok = all(
        p.partition("=")[2].strip('"') in ("utf-8", "utf8")
        for p in params
        if p.partition("=")[0].strip() == "charset"
    )
    if media != "application/json" or not charset_ok:
        shown = clean_text(value, max_len=80) if value else "none"
        raise Refusal(
            415, f"the request must be sent as Content-Type: application/json (got {shown})"
        )


def preflight_headers(allow: bytes, *, cors: bool) -> Headers:
    if not cors:
        return ((b"allow", allow),)
    return (
        (b"allow", allow),
        (b"access-control-allow-methods", allow),
        (b"access-control-allow-headers", b"authorization, content-type"),
        (b"access-control-max-age", b"600"),
    )


async def lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
