"""``edgekit serve``: an OpenAI-compatible HTTP server for one loaded Session.

Endpoints: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions``
(each streaming as server-sent events when ``stream`` is true) and ``GET /health``.

Every request is hostile until checked. In this order, each refusal an OpenAI-style JSON
error (``{"error": {"message", "type", "param", "code"}}``):

1. ``Host`` (403): an IP address, ``localhost``, the bound name or an ``allow_hosts`` name.
   A web page that rebinds its own DNS name to 127.0.0.1 sends its name here.
2. ``Origin`` (403): a browser page of another origin, unless in ``allow_origins`` (which
   alone get CORS headers, and an answer to their preflight).
3. The API key (401), compared in constant time.
4. ``Content-Type: application/json`` (415): a form or ``text/plain`` POST is what any page
   can send without asking first.
5. The body: 413 over ``max_request_bytes``, 408 when slower than ``body_timeout``, then
   ``edgekit.serve_requests.read_request`` (400 naming the field: the OpenAI schema).
6. Admission (503): at most ``queue_size`` requests running or waiting.
7. The prompt: chat template (bounded by the target) and tokenizer run on a worker thread,
   so a slow template never stalls the event loop; 400 when it does not fit the context.
8. Its turn (one generation at a time, first come first served), then the generation on a
   worker thread, its chunks handed to the event loop.

One coroutine owns a request from admission to its end and gives the slot back in a
``finally``, whatever happens. A task watches the connection: when the client goes away,
a waiting request leaves the queue, and the running one stops its own generation at the
next token (``Session.cancel`` is called only while that generation is the one running,
never on another client's). A stream that fails ends with an error event, not ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import re
import socket
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, TypeVar

from edgekit.errors import EdgekitError, RequestError, ServeError, SettingError
from edgekit.serve_requests import GenerationRequest, read_request
from edgekit.targets.base import Sampling, Session, StreamChunk
from edgekit.untrusted import clean_text

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
T = TypeVar("T")

_LOOPBACK_NAMES = ("localhost",)
_WILDCARDS = ("0.0.0.0", "::", "")
_HOST_HEADER = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::(\d{1,5}))?")
_ORIGIN = re.compile(r"([a-z][a-z0-9+.-]*)://(\[[0-9a-f:.]+\]|[a-z0-9.-]+)(?::(\d{1,5}))?")
_DEFAULT_PORTS = {"http": 80, "https": 443}
_KEY = re.compile(r"[\x21-\x7e]+")  # printable ASCII without spaces: what a header can carry


@dataclass(frozen=True, kw_only=True)
class ServeConfig:
    """How the server runs. Checked when made (ServeError): no empty API key, and no
    address beyond loopback without a key unless ``insecure_no_auth`` says so."""

    model_name: str
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_request_bytes: int = 1 << 20
    max_tokens_limit: int = 4096
    queue_size: int = 8
    allow_hosts: tuple[str, ...] = ()  # Host names accepted beyond the bound address ("*": any)
    allow_origins: tuple[str, ...] = ()  # web origins that may call it ("*": any)
    insecure_no_auth: bool = False  # serve beyond loopback without an API key
    body_timeout: float = 30.0  # seconds a client may take to send its request body
    send_timeout: float = 60.0  # seconds a client may leave a part of the answer unread

    def __post_init__(self) -> None:
        if self.api_key is not None and not self.api_key.strip():
            raise ServeError(
                "the API key is empty: every client would be let in",
                hint="pass a real key with --api-key (or $EDGEKIT_API_KEY), or leave it out "
                "to serve on loopback without one",
            )
        if self.api_key is not None and not _KEY.fullmatch(self.api_key):
            raise ServeError(
                "the API key must be printable ASCII without spaces (it travels in an HTTP header)",
                hint="make one with: python -c 'import secrets; print(secrets.token_urlsafe())'",
            )
        if self.api_key is None and not is_loopback(self.host) and not self.insecure_no_auth:
            raise ServeError(
                f"serving on {clean_text(self.host)} without an API key would let anyone who "
                f"can reach port {self.port} use the model",
                hint="pass --api-key KEY (or set $EDGEKIT_API_KEY), or --insecure-no-auth to "
                "serve without a key anyway",
            )
        for name, value, low in (
            ("port", self.port, 0),
            ("max_request_bytes", self.max_request_bytes, 1),
            ("max_tokens_limit", self.max_tokens_limit, 1),
            ("queue_size", self.queue_size, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ServeError(f"{name} must be an integer of at least {low}, not {value!r}")
        if self.port > 65535:
            raise ServeError(f"port must be at most 65535, not {self.port}")
        for name, seconds in (
            ("body_timeout", self.body_timeout),
            ("send_timeout", self.send_timeout),
        ):
            if not seconds > 0:
                raise ServeError(f"{name} must be a positive number of seconds, not {seconds!r}")
        object.__setattr__(self, "allow_hosts", tuple(_allowed_host(h) for h in self.allow_hosts))
        object.__setattr__(
            self, "allow_origins", tuple(_allowed_origin(o) for o in self.allow_origins)
        )


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a bind address) is reachable from this machine only."""
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _allowed_host(value: str) -> str:
    name = value.strip().lower().strip("[]")
    if name != "*" and not re.fullmatch(r"[a-z0-9.:-]+", name):
        raise ServeError(
            f"--allow-host {clean_text(value)!r} is not a host name",
            hint="pass a name such as mybox.lan, or * to accept any",
        )
    return name


def _allowed_origin(value: str) -> str:
    origin = value.strip().lower().rstrip("/")
    if origin not in ("*", "null") and not _ORIGIN.fullmatch(origin):
        raise ServeError(
            f"--allow-origin {clean_text(value)!r} is not a web origin",
            hint="pass scheme://host[:port], such as http://localhost:3000, or * for any",
        )
    return origin


@dataclass
class ServeStats:
    """Counters the server keeps (tests and logs read them)."""

    received: int = 0  # generation requests that reached the server
    open: int = 0  # of those, not finished yet (from their headers to their end)
    requests: int = 0  # admitted
    rejected_busy: int = 0  # answered 503
    cancelled: int = 0  # generations stopped because their client went away
    left_queue: int = 0  # clients gone before their generation started
    active: int = 0  # requests admitted and not yet finished
    finish_reasons: Counter[str] = field(default_factory=Counter)


class _Refusal(Exception):
    """A request the server answers with an error status (raised inside the app only)."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        *,
        param: str | None = None,
        headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param
        self.headers = headers


class _ClientGone(Exception):
    """The client closed the connection before its request was read."""


_GONE = object()  # posted to a request's inbox when its client disconnects
_DONE = object()  # posted by a generation's thread when it has finished


def create_app(session: Session, config: ServeConfig) -> _App:
    """The ASGI application serving ``session`` (run it with uvicorn, or ``serve``)."""
    return _App(session, config)


def serve(session: Session, config: ServeConfig) -> None:
    """Run the server until interrupted (blocking)."""
    import uvicorn

    if config.api_key is None and not is_loopback(config.host):
        log.warning(
            "serving on %s:%d without an API key: anyone who can reach it can use the model",
            clean_text(config.host),
            config.port,
        )
    uvicorn.run(
        create_app(session, config),
        host=config.host,
        port=config.port,
        log_config=_uvicorn_log_config(),
        log_level="info",
        lifespan="on",
        proxy_headers=False,  # no X-Forwarded-* from whoever connects
        server_header=False,
    )


def _uvicorn_log_config() -> dict[str, Any]:
    """uvicorn's own logging config with edgekit's cleaning filter on every handler: its
    loggers have handlers of their own, and their records carry client-controlled text
    (paths, header values) that must not reach a terminal raw."""
    import copy

    from uvicorn.config import LOGGING_CONFIG

    config: dict[str, Any] = copy.deepcopy(LOGGING_CONFIG)
    config.setdefault("filters", {})["clean"] = {"()": "edgekit.terminal_text.CleanLogRecords"}
    for handler in config["handlers"].values():
        handler.setdefault("filters", []).append("clean")
    return config


# --- the application -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Route:
    methods: tuple[str, ...]


_ROUTES = {
    "/health": _Route(("GET",)),
    "/v1/models": _Route(("GET",)),
    "/v1/completions": _Route(("POST",)),
    "/v1/chat/completions": _Route(("POST",)),
}


class _App:
    def __init__(self, session: Session, config: ServeConfig) -> None:
        self.session = session
        self.config = config
        self.stats = ServeStats()
        self.state = SimpleNamespace(stats=self.stats)  # as Starlette apps expose it
        self.created = int(time.time())
        self._hostname = socket.gethostname().lower()
        self._turn: asyncio.Lock | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)
        # anything else (websockets) is closed by the server unanswered

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        out = _Responder(send, self.config.send_timeout)
        try:
            headers = _Headers(scope.get("headers", []))
            out.extra = self._check_caller(headers)
            await self._route(scope, receive, out, headers)
        except _Refusal as exc:
            await out.error(exc.status, exc.message, exc.kind, param=exc.param, headers=exc.headers)
        except RequestError as exc:
            await out.error(400, str(exc), param=exc.param)
        except _ClientGone:
            pass
        except Exception as exc:  # noqa: BLE001 - a bug must cost one request, not the server
            log.exception("edgekit serve: unexpected failure")
            await out.error(500, f"internal error: {type(exc).__name__}", "server_error")

    async def _route(
        self, scope: Scope, receive: Receive, out: _Responder, headers: _Headers
    ) -> None:
        path, method = scope.get("path", ""), scope.get("method", "")
        route = _ROUTES.get(path)
        if route is None:
            raise _Refusal(404, f"no such endpoint: {clean_text(path, max_len=80)}", "not_found")
        allow = ", ".join((*route.methods, "OPTIONS")).encode()
        if method == "OPTIONS":
            await out.empty(204, _preflight_headers(allow, cors=bool(out.extra)))
            return
        if method not in route.methods:
            raise _Refusal(
                405,
                f"{clean_text(method, max_len=20)} is not allowed on {path}",
                headers=((b"allow", allow),),
            )
        if path == "/health":
            await out.json(200, {"status": "ok"})
            return
        self._authorize(headers)
        if path == "/v1/models":
            await out.json(200, self._models())
            return
        _require_json(headers)
        self.stats.received += 1
        self.stats.open += 1
        try:
            raw = await self._read_body(receive, headers)
            request = read_request(
                raw,
                chat=path == "/v1/chat/completions",
                max_bytes=self.config.max_request_bytes,
                max_tokens_limit=self.config.max_tokens_limit,
            )
            await self._admit(receive, out, request)
        finally:
            self.stats.open -= 1

    # --- who may call -----------------------------------------------------------------------

    def _check_caller(self, headers: _Headers) -> tuple[tuple[bytes, bytes], ...]:
        """Refuse a foreign Host or Origin; the CORS headers an allowed origin gets."""
        host = headers.one("host")
        if host is None:
            raise _Refusal(400, "the request has no Host header")
        parsed = _HOST_HEADER.fullmatch(host)
        if parsed is None or not self._host_allowed(parsed.group(1).lower().strip("[]")):
            raise _Refusal(
                403,
                f"the Host {clean_text(host, max_len=80)!r} is not this server's address "
                "(a page that rebinds its DNS name to this machine sends its own name)",
                "permission_error",
            )
        origin = headers.one("origin")
        if origin is None:
            return ()
        normal = origin.strip().lower().rstrip("/")
        allowed = self.config.allow_origins
        if "*" in allowed or normal in allowed:
            return (
                (b"access-control-allow-origin", origin.encode("latin-1")),
                (b"vary", b"Origin"),
            )
        if _same_origin(normal, host):
            return ()
        raise _Refusal(
            403,
            f"requests from the web page at {clean_text(origin, max_len=80)} are not allowed "
            "(start the server with --allow-origin to let a page use it)",
            "permission_error",
        )

    def _host_allowed(self, name: str) -> bool:
        allowed = self.config.allow_hosts
        if "*" in allowed or name in allowed or name in _LOOPBACK_NAMES:
            return True
        if name == self.config.host.lower().strip("[]"):
            return True
        if self.config.host in _WILDCARDS and name == self._hostname:
            return True
        try:
            ipaddress.ip_address(name)  # an address cannot be rebound: no page is served by it
        except ValueError:
            return False
        return True

    def _authorize(self, headers: _Headers) -> None:
        key = self.config.api_key
        if key is None:
            return
        value = headers.one("authorization") or ""
        scheme, _, token = value.partition(" ")
        good = scheme.lower() == "bearer" and hmac.compare_digest(
            token.strip().encode("latin-1"), key.encode("ascii")
        )
        if not good:
            raise _Refusal(
                401,
                "invalid or missing API key (send Authorization: Bearer KEY)",
                "authentication_error",
                headers=((b"www-authenticate", b"Bearer"),),
            )

    # --- reading the request ------------------------------------------------------------------

    async def _read_body(self, receive: Receive, headers: _Headers) -> bytes:
        limit = self.config.max_request_bytes
        declared = headers.one("content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > limit:
            raise _Refusal(413, f"the request body is over {limit} bytes")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.body_timeout
        parts: list[bytes] = []
        size = 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                raise _Refusal(
                    408, f"the request body did not arrive within {self.config.body_timeout:g} s"
                ) from None
            if message["type"] == "http.disconnect":
                raise _ClientGone
            part = message.get("body", b"")
            size += len(part)
            if size > limit:
                raise _Refusal(413, f"the request body is over {limit} bytes")
            parts.append(part)
            if not message.get("more_body", False):
                return b"".join(parts)

    def _models(self) -> dict[str, Any]:
        model = {
            "id": self.config.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "edgekit",
        }
        return {"object": "list", "data": [model]}

    # --- one generation request, from admission to its end ------------------------------------

    async def _admit(self, receive: Receive, out: _Responder, request: GenerationRequest) -> None:
        if self.stats.active >= self.config.queue_size:
            self.stats.rejected_busy += 1
            raise _Refusal(503, "the server is busy: the request queue is full", "server_busy")
        self.stats.active += 1
        self.stats.requests += 1
        client = _Client(receive)
        try:
            await self._serve_admitted(out, request, client)
        finally:
            client.close()
            self.stats.active -= 1

    async def _serve_admitted(
        self, out: _Responder, request: GenerationRequest, client: _Client
    ) -> None:
        try:
            tokens = await _in_thread(self._prompt_tokens, request)
        except EdgekitError as exc:
            # the messages or the prompt were refused: by the template (its own checks,
            # or a bound on it), or by the tokenizer
            raise RequestError(str(exc), param="messages" if request.chat else "prompt") from exc
        context = self.session.info.context_length
        if len(tokens) >= context:
            raise RequestError(
                f"the prompt has {len(tokens)} tokens; this model's context holds {context}",
                param="messages" if request.chat else "prompt",
                hint="send a shorter prompt",
            )
        if not await self._wait_turn(client):
            self.stats.left_queue += 1
            return
        try:
            await self._generate(out, request, tokens, client)
        finally:
            self._turn_lock().release()

    def _prompt_tokens(self, request: GenerationRequest) -> list[int]:
        """Runs on a worker thread: a chat template may take its whole time bound."""
        if request.chat:
            return self.session.chat_tokens(list(request.messages))
        return self.session.tokenize(request.prompt)

    def _turn_lock(self) -> asyncio.Lock:
        if self._turn is None:  # made on the server's event loop, at the first request
            self._turn = asyncio.Lock()
        return self._turn

    async def _wait_turn(self, client: _Client) -> bool:
        """Wait (first come, first served) until no other generation runs; False, and
        not holding the turn, when the client goes away first."""
        turn = self._turn_lock()
        acquire = asyncio.ensure_future(turn.acquire())
        gone = asyncio.ensure_future(client.gone.wait())
        try:
            await asyncio.wait({acquire, gone}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # the server is stopping: never keep the turn
            gone.cancel()
            acquire.cancel()
            if _holds(acquire):
                turn.release()
            raise
        gone.cancel()
        if not acquire.done():
            acquire.cancel()  # a cancelled Lock.acquire() hands a wake-up on to the next
            await asyncio.wait({acquire})
        held = _holds(acquire)
        if held and client.gone.is_set():  # both at once: it is gone all the same
            turn.release()
            return False
        return held

    async def _generate(
        self, out: _Responder, request: GenerationRequest, tokens: list[int], client: _Client
    ) -> None:
        answer: _Answer = (
            _EventStream(out, request, self.config.model_name, len(tokens))
            if request.stream
            else _Collected(out, request, self.config.model_name, len(tokens))
        )
        worker = _Generation(self.session, tokens, request.sampling, client.inbox)
        worker.start()
        left = False
        failure: BaseException | None = None
        try:
            # Read the inbox until the thread says it is done, whatever else happens: the
            # turn is handed on only once this generation has let go of the session.
            while (item := await client.inbox.get()) is not _DONE:
                if isinstance(item, BaseException):
                    failure = item
                elif isinstance(item, StreamChunk) and not left:
                    if item.finish_reason:
                        self.stats.finish_reasons[item.finish_reason] += 1
                    await answer.chunk(item)
                # gone, or stopped reading (as good as gone): stop its generation
                if not left and (item is _GONE or out.stalled):
                    left = True
                    worker.abandon()
                    self.stats.cancelled += 1
        finally:
            worker.abandon_unless_done()
        if left:
            return
        if failure is not None:
            log.warning("generation failed: %s", clean_text(failure, max_len=500))
            await answer.fail(failure)
        else:
            await answer.finish()


def _holds(acquire: asyncio.Future[Any]) -> bool:
    """Whether a finished ``Lock.acquire()`` task got the lock."""
    return acquire.done() and not acquire.cancelled() and acquire.exception() is None


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def _same_origin(origin: str, host: str) -> bool:
    """Whether a browser's ``Origin`` is the server itself, as the ``Host`` names it."""
    o = _ORIGIN.fullmatch(origin)
    h = _HOST_HEADER.fullmatch(host.lower())
    if o is None or h is None or o.group(1) not in _DEFAULT_PORTS:
        return False
    o_port = int(o.group(3)) if o.group(3) else _DEFAULT_PORTS[o.group(1)]
    h_port = int(h.group(2)) if h.group(2) else _DEFAULT_PORTS[o.group(1)]
    return o.group(2) == h.group(1) and o_port == h_port


def _require_json(headers: _Headers) -> None:
    value = headers.one("content-type") or ""
    media, *params = [p.strip().lower() for p in value.split(";")]
    charset_ok = all(
        p.partition("=")[2].strip('"') in ("utf-8", "utf8")
        for p in params
        if p.partition("=")[0].strip() == "charset"
    )
    if media != "application/json" or not charset_ok:
        shown = clean_text(value, max_len=80) if value else "none"
        raise _Refusal(
            415, f"the request must be sent as Content-Type: application/json (got {shown})"
        )


def _preflight_headers(allow: bytes, *, cors: bool) -> tuple[tuple[bytes, bytes], ...]:
    if not cors:
        return ((b"allow", allow),)
    return (
        (b"allow", allow),
        (b"access-control-allow-methods", allow),
        (b"access-control-allow-headers", b"authorization, content-type"),
        (b"access-control-max-age", b"600"),
    )


class _Headers:
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
            raise _Refusal(400, f"the {name} header is repeated")
        return values[0]


class _Responder:
    """Sends one response; ``extra`` headers (CORS) go on it, whatever it is.

    A client that stops reading (its socket buffers full) makes a send wait: after
    ``send_timeout`` it counts as gone (``stalled``), and nothing more is sent to it, so
    it cannot hold the one generation slot by reading slowly. The server then closes the
    connection, since the response was not completed."""

    def __init__(self, send: Send, send_timeout: float) -> None:
        self._send = send
        self._timeout = send_timeout
        self.extra: tuple[tuple[bytes, bytes], ...] = ()
        self.started = False
        self.stalled = False

    async def _out(self, message: Message) -> None:
        if self.stalled:
            return
        try:
            await asyncio.wait_for(self._send(message), self._timeout)
        except TimeoutError:
            self.stalled = True

    async def start(self, status: int, headers: tuple[tuple[bytes, bytes], ...]) -> None:
        self.started = True
        await self._out(
            {"type": "http.response.start", "status": status, "headers": [*headers, *self.extra]}
        )

    async def body(self, data: bytes, *, more: bool) -> None:
        await self._out({"type": "http.response.body", "body": data, "more_body": more})

    async def json(
        self, status: int, payload: Any, headers: tuple[tuple[bytes, bytes], ...] = ()
    ) -> None:
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

    async def empty(self, status: int, headers: tuple[tuple[bytes, bytes], ...]) -> None:
        await self.start(status, headers)
        await self.body(b"", more=False)

    async def error(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        *,
        param: str | None = None,
        headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> None:
        if self.started:  # too late for a status: the stream ends
            await self.body(b"", more=False)
            return
        await self.json(status, _error_body(status, message, kind, param), headers)


def _error_body(status: int, message: str, kind: str, param: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


# --- the connection and the generation thread ------------------------------------------------


class _Client:
    """Watches one request's connection (after its body was read): posts ``_GONE`` to the
    inbox, and sets ``gone``, when the client disconnects."""

    def __init__(self, receive: Receive) -> None:
        self.gone = asyncio.Event()
        self.inbox: asyncio.Queue[object] = asyncio.Queue()
        self._task = asyncio.ensure_future(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.gone.set()
                self.inbox.put_nowait(_GONE)
                return

    def close(self) -> None:
        self._task.cancel()


class _Generation:
    """One generation on its own thread. Chunks, a failure, then ``_DONE`` go to the
    request's inbox on the event loop."""

    def __init__(
        self, session: Session, tokens: list[int], sampling: Sampling, inbox: asyncio.Queue[object]
    ) -> None:
        self.session = session
        self.tokens = tokens
        self.sampling = sampling
        self.inbox = inbox
        self.loop = asyncio.get_running_loop()
        self.stop = threading.Event()  # this request wants no more chunks
        self.started = threading.Event()  # this generation holds the session
        self.done = False
        self.thread = threading.Thread(
            target=self._run, name="edgekit-serve-generation", daemon=True
        )

    def start(self) -> None:
        self.thread.start()

    def abandon(self) -> None:
        """Stop at the next token. ``stop`` is set before ``started`` is read, and the
        thread sets ``started`` before it reads ``stop``: either this cancels the session
        while this generation holds it, or the thread sees ``stop`` and never starts."""
        self.stop.set()
        if self.started.is_set() and not self.done:
            self.session.cancel()

    def abandon_unless_done(self) -> None:
        if not self.done:
            self.abandon()

    def _post(self, item: object) -> None:
        with contextlib.suppress(RuntimeError):  # the event loop is closed: the server stopped
            self.loop.call_soon_threadsafe(self.inbox.put_nowait, item)

    def _run(self) -> None:
        try:
            chunks = _held_chunks(self.session, self.tokens, self.sampling, self.started, self.stop)
            for chunk in chunks:
                if self.stop.is_set():
                    break
                self._post(chunk)
            chunks.close()
        except BaseException as exc:  # noqa: BLE001 - delivered to the event loop
            self._post(exc)
        finally:
            self.done = True
            self._post(_DONE)


def _held_chunks(
    session: Session,
    tokens: list[int],
    sampling: Sampling,
    started: threading.Event,
    stop: threading.Event,
) -> Generator[StreamChunk, None, None]:
    """The chunks of one generation from token ids, holding the session as
    ``Session.stream`` does (the server tokenized the prompt itself, off the lock)."""
    with session._hold():
        started.set()
        if stop.is_set():  # abandoned before it held the session: see _Generation.abandon
            return
        chunks = session.stream_tokens(tokens, sampling)
        try:
            yield from chunks
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()


async def _in_thread(fn: Callable[[GenerationRequest], T], arg: GenerationRequest) -> T:
    """``fn(arg)`` on a thread of its own (daemon: a stuck call never blocks exit)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, exc: BaseException | None) -> None:
        if future.done():
            return
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)

    def run() -> None:
        try:
            result, exc = fn(arg), None
        except BaseException as error:  # noqa: BLE001 - delivered to the event loop
            result, exc = None, error
        with contextlib.suppress(RuntimeError):  # the event loop is closed
            loop.call_soon_threadsafe(settle, result, exc)

    threading.Thread(target=run, name="edgekit-serve-prompt", daemon=True).start()
    return await future


# --- answers ------------------------------------------------------------------------------------


def _finish(reason: str) -> str:
    return "length" if reason == "length" else "stop"


class _Answer(ABC):
    """How one generation's chunks become the answer: collected, or streamed."""

    def __init__(
        self, out: _Responder, request: GenerationRequest, model: str, prompt_tokens: int
    ) -> None:
        self.out = out
        self.request = request
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.ident = ("chatcmpl-" if request.chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.tokens = 0
        self.reason: str | None = None

    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.tokens,
            "total_tokens": self.prompt_tokens + self.tokens,
        }

    @abstractmethod
    async def chunk(self, chunk: StreamChunk) -> None: ...

    @abstractmethod
    async def finish(self) -> None: ...

    async def fail(self, exc: BaseException) -> None:
        status, kind = _failure_status(exc)
        await self.out.error(status, _failure_text(exc), kind)


def _failure_status(exc: BaseException) -> tuple[int, str]:
    # A SettingError from the runtime is about what the request asked for.
    return (
        (400, "invalid_request_error") if isinstance(exc, SettingError) else (500, "server_error")
    )


def _failure_text(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, EdgekitError) else f"generation failed: {type(exc).__name__}"


class _Collected(_Answer):
    """A whole answer, sent when the generation ends."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.text: list[str] = []

    async def chunk(self, chunk: StreamChunk) -> None:
        self.text.append(chunk.text)
        self.tokens += chunk.tokens
        self.reason = chunk.finish_reason or self.reason

    async def finish(self) -> None:
        text = "".join(self.text)
        choice: dict[str, Any] = {
            "index": 0,
            "finish_reason": _finish(self.reason or "length"),
            "logprobs": None,
        }
        if self.request.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        await self.out.json(
            200,
            {
                "id": self.ident,
                "object": "chat.completion" if self.request.chat else "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": [choice],
                "usage": self.usage(),
            },
        )


class _EventStream(_Answer):
    """Server-sent events, started at the first chunk (so a generation that fails at
    once still gets a proper error status)."""

    async def _begin(self) -> None:
        if self.out.started:
            return
        await self.out.start(
            200,
            (
                (b"content-type", b"text/event-stream; charset=utf-8"),
                (b"cache-control", b"no-cache"),
                (b"x-accel-buffering", b"no"),
            ),
        )
        if self.request.chat:
            await self._event(self._choice({"role": "assistant", "content": ""}, None))

    async def _event(self, payload: dict[str, Any]) -> None:
        await self.out.body(f"data: {json.dumps(payload)}\n\n".encode(), more=True)

    def _choice(self, delta: Any, finish: str | None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
        if self.request.chat:
            choice["delta"] = delta
        else:
            choice["text"] = delta
        return {
            "id": self.ident,
            "object": "chat.completion.chunk" if self.request.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }

    async def chunk(self, chunk: StreamChunk) -> None:
        await self._begin()
        self.tokens += chunk.tokens
        if chunk.text:
            await self._event(
                self._choice({"content": chunk.text} if self.request.chat else chunk.text, None)
            )
        if chunk.finish_reason and self.reason is None:
            self.reason = chunk.finish_reason
            await self._event(self._choice({} if self.request.chat else "", _finish(self.reason)))

    async def finish(self) -> None:
        await self._begin()
        if self.reason is None:  # the runtime ended without saying why: its budget ran out
            self.reason = "length"
            await self._event(self._choice({} if self.request.chat else "", "length"))
        if self.request.include_usage:
            payload = self._choice(None, None)
            payload["choices"] = []
            payload["usage"] = self.usage()
            await self._event(payload)
        await self.out.body(b"data: [DONE]\n\n", more=False)

    async def fail(self, exc: BaseException) -> None:
        if not self.out.started:
            await super().fail(exc)
            return
        status, kind = _failure_status(exc)
        await self._event(_error_body(status, _failure_text(exc), kind, None))
        await self.out.body(b"", more=False)
