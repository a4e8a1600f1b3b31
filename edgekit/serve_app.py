"""The ASGI application of ``edgekit serve`` (edgekit/serve.py describes what it does):
routing, who may call, reading the request, admission, and one generation request from
admission to its end.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from edgekit.errors import EdgekitError, RequestError
from edgekit.serve_config import (
    HOST_HEADER,
    LOOPBACK_NAMES,
    WILDCARDS,
    ServeConfig,
    same_origin,
)
from edgekit.serve_generation import (
    DONE,
    GONE,
    Client,
    GenerationThread,
    answer_for,
    failure_status,
    in_thread,
)
from edgekit.serve_http import (
    ClientGone,
    Headers,
    Receive,
    Refusal,
    RequestHeaders,
    Responder,
    Scope,
    Send,
    lifespan,
    preflight_headers,
    require_json,
)
from edgekit.serve_metrics import CONTENT_TYPE
from edgekit.serve_requests import GenerationRequest, read_request
from edgekit.serve_telemetry import CLIENT_CLOSED, ServeMetrics, Trace
from edgekit.targets.session import Session
from edgekit.targets.values import StreamChunk
from edgekit.untrusted import clean_text

log = logging.getLogger("edgekit.serve")

ROUTES: dict[str, tuple[str, ...]] = {  # path -> methods
    "/health": ("GET",),
    "/metrics": ("GET",),
    "/v1/models": ("GET",),
    "/v1/completions": ("POST",),
    "/v1/chat/completions": ("POST",),
}


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


class App:
    def __init__(self, session: Session, config: ServeConfig) -> None:
        self.session = session
        self.config = config
        self.stats = ServeStats()
        self.state = SimpleNamespace(stats=self.stats)  # as Starlette apps expose it
        self.created = int(time.time())
        self._hostname = socket.gethostname().lower()
        self.metrics = ServeMetrics(
            model=config.model_name, target=session.info.target, slots=lambda: _slots(session)
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)
        # anything else (websockets) is closed by the server unanswered

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        out = Responder(send, self.config.send_timeout)
        trace = self.metrics.received(scope.get("path", ""))
        try:
            headers = RequestHeaders(scope.get("headers", []))
            out.extra = self._check_caller(headers)
            await self._route(scope, receive, out, headers, trace)
        except Refusal as exc:
            trace.outcome = _refused(exc.status)
            await out.error(exc.status, exc.message, exc.kind, param=exc.param, headers=exc.headers)
        except RequestError as exc:
            trace.outcome = "refused"
            await out.error(400, str(exc), param=exc.param)
        except ClientGone:
            trace.outcome = "client_gone"
        except Exception as exc:  # noqa: BLE001 - a bug must cost one request, not the server
            trace.outcome = "failed"
            log.exception("edgekit serve: unexpected failure")
            await out.error(500, f"internal error: {type(exc).__name__}", "server_error")
        finally:
            if out.stalled:
                trace.outcome = "client_gone"
            self.metrics.done(trace, out.status or CLIENT_CLOSED)

    async def _route(
        self, scope: Scope, receive: Receive, out: Responder, headers: RequestHeaders, trace: Trace
    ) -> None:
        path, method = scope.get("path", ""), scope.get("method", "")
        methods = ROUTES.get(path)
        if methods is None:
            raise Refusal(404, f"no such endpoint: {clean_text(path, max_len=80)}", "not_found")
        allow = ", ".join((*methods, "OPTIONS")).encode()
        if method == "OPTIONS":
            await out.empty(204, preflight_headers(allow, cors=bool(out.extra)))
            return
        if method not in methods:
            raise Refusal(
                405,
                f"{clean_text(method, max_len=20)} is not allowed on {path}",
                headers=((b"allow", allow),),
            )
        if path == "/health":
            await out.json(200, self._health())
            return
        self._authorize(headers)
        if path == "/v1/models":
            await out.json(200, self._models())
            return
        if path == "/metrics":
            await out.text(200, self.metrics.render(), CONTENT_TYPE)
            return
        require_json(headers)
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
            await self._admit(receive, out, request, trace)
        finally:
            self.stats.open -= 1

    # --- who may call -----------------------------------------------------------------------

    def _check_caller(self, headers: RequestHeaders) -> Headers:
        """Refuse a foreign Host or Origin; the CORS headers an allowed origin gets."""
        host = headers.one("host")
        if host is None:
            raise Refusal(400, "the request has no Host header")
        parsed = HOST_HEADER.fullmatch(host)
        if parsed is None or not self._host_allowed(parsed.group(1).lower().strip("[]")):
            raise Refusal(
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
        if same_origin(normal, host):
            return ()
        raise Refusal(
            403,
            f"requests from the web page at {clean_text(origin, max_len=80)} are not allowed "
            "(start the server with --allow-origin to let a page use it)",
            "permission_error",
        )

    def _host_allowed(self, name: str) -> bool:
        allowed = self.config.allow_hosts
        if "*" in allowed or name in allowed or name in LOOPBACK_NAMES:
            return True
        if name == self.config.host.lower().strip("[]"):
            return True
        if self.config.host in WILDCARDS and name == self._hostname:
            return True
        try:
            ipaddress.ip_address(name)  # an address cannot be rebound: no page is served by it
        except ValueError:
            return False
        return True

    def _authorize(self, headers: RequestHeaders) -> None:
        key = self.config.api_key
        if key is None:
            return
        value = headers.one("authorization") or ""
        scheme, _, token = value.partition(" ")
        good = scheme.lower() == "bearer" and hmac.compare_digest(
            token.strip().encode("latin-1"), key.encode("ascii")
        )
        if not good:
            raise Refusal(
                401,
                "invalid or missing API key (send Authorization: Bearer KEY)",
                "authentication_error",
                headers=((b"www-authenticate", b"Bearer"),),
            )

    # --- reading the request ------------------------------------------------------------------

    async def _read_body(self, receive: Receive, headers: RequestHeaders) -> bytes:
        limit = self.config.max_request_bytes
        declared = headers.one("content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > limit:
            raise Refusal(413, f"the request body is over {limit} bytes")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.body_timeout
        parts: list[bytes] = []
        size = 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                raise Refusal(
                    408, f"the request body did not arrive within {self.config.body_timeout:g} s"
                ) from None
            if message["type"] == "http.disconnect":
                raise ClientGone
            part = message.get("body", b"")
            size += len(part)
            if size > limit:
                raise Refusal(413, f"the request body is over {limit} bytes")
            parts.append(part)
            if not message.get("more_body", False):
                return b"".join(parts)

    def _health(self) -> dict[str, Any]:
        """For load balancers: no key needed, nothing computed but two counts."""
        busy = self.metrics.processing()
        return {
            "status": "ok",
            "slots_idle": max(0, self.metrics.slots() - busy),
            "slots_processing": busy,
        }

    def _models(self) -> dict[str, Any]:
        model = {
            "id": self.config.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "edgekit",
        }
        return {"object": "list", "data": [model]}

    # --- one generation request, from admission to its end ------------------------------------

    async def _admit(
        self, receive: Receive, out: Responder, request: GenerationRequest, trace: Trace
    ) -> None:
        if self.stats.active >= self.config.queue_size:
            self.stats.rejected_busy += 1
            raise Refusal(503, "the server is busy: the request queue is full", "server_busy")
        self.stats.active += 1
        self.stats.requests += 1
        self.metrics.admitted(trace)
        client = Client(receive)
        try:
            await self._serve_admitted(out, request, client, trace)
        finally:
            client.close()
            self.stats.active -= 1

    async def _serve_admitted(
        self, out: Responder, request: GenerationRequest, client: Client, trace: Trace
    ) -> None:
        try:
            tokens = await in_thread(self._prompt_tokens, request)
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
        if client.gone.is_set():  # gone while its prompt was made: it never queues
            self.stats.left_queue += 1
            trace.outcome = "client_gone"
            return
        await self._generate(out, request, tokens, client, trace)

    def _prompt_tokens(self, request: GenerationRequest) -> list[int]:
        """Runs on a worker thread: a chat template may take its whole time bound."""
        if request.chat:
            return self.session.chat_tokens(list(request.messages))
        return self.session.tokenize(request.prompt)

    async def _generate(
        self,
        out: Responder,
        request: GenerationRequest,
        tokens: list[int],
        client: Client,
        trace: Trace,
    ) -> None:
        answer = answer_for(out, request, self.config.model_name, len(tokens))
        worker = GenerationThread(self.session.start(tokens, request.sampling), client.inbox)
        left = False
        failure: BaseException | None = None
        self.metrics.begun(trace, worker.handle)
        try:
            worker.start()
            while (item := await client.inbox.get()) is not DONE:
                if isinstance(item, BaseException):
                    failure = item
                elif isinstance(item, StreamChunk):
                    self.metrics.chunk(trace, item)  # generated, whether it is sent or not
                    if not left:
                        if item.finish_reason:
                            self.stats.finish_reasons[item.finish_reason] += 1
                        await answer.chunk(item)
                # gone, or stopped reading (as good as gone): its own generation ends
                if not left and (item is GONE or out.stalled):
                    left = True
                    worker.stop()
        finally:
            worker.stop()  # the server is stopping, or the answer failed: never left running
            self.metrics.ended(trace)
        if left:
            trace.outcome = "client_gone"
            if worker.handle.started:
                self.stats.cancelled += 1
            else:
                self.stats.left_queue += 1
            return
        if failure is not None:
            trace.outcome = "refused" if failure_status(failure)[0] < 500 else "failed"
            log.warning("generation failed: %s", clean_text(failure, max_len=500))
            await answer.fail(failure)
        else:
            await answer.finish()


def _refused(status: int) -> str:
    """The outcome of a request refused with ``status``."""
    if status == 503:
        return "busy"
    return "refused" if status < 500 else "failed"


def _slots(session: Session) -> int:
    """How many generations the session runs at once: a batched session says
    (``parallel``); one at a time otherwise."""
    parallel = getattr(session, "parallel", 1)
    return parallel if isinstance(parallel, int) and parallel >= 1 else 1
