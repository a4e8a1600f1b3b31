"""``edgekit serve``: an OpenAI-compatible HTTP server for one loaded Session.

Endpoints: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions``,
each streaming as server-sent events when ``stream`` is true. Limits, all configurable:
request body size (413), ``max_tokens`` (400), an API key (401), and a bounded queue of
waiting requests (503 when full; the Session runs one generation at a time). A client
that disconnects mid-stream cancels its generation at the next token.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from edgekit.errors import EdgekitError
from edgekit.targets.base import Sampling, Session, StreamChunk

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ServeConfig:
    model_name: str
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_request_bytes: int = 1 << 20
    max_tokens_limit: int = 4096
    queue_size: int = 8


@dataclass
class ServeStats:
    """Counters the server keeps (tests and logs read them)."""

    requests: int = 0
    rejected_busy: int = 0
    cancelled: int = 0
    finish_reasons: list[str] = field(default_factory=list)


class _Admission:
    """At most ``limit`` requests in the building (running + waiting); more get 503."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0
        self.lock = threading.Lock()

    def enter(self) -> bool:
        with self.lock:
            if self.count >= self.limit:
                return False
            self.count += 1
            return True

    def leave(self) -> None:
        with self.lock:
            self.count -= 1


class _ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def create_app(session: Session, config: ServeConfig) -> Any:
    """The Starlette application serving ``session``."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    admission = _Admission(config.queue_size)
    stats = ServeStats()

    def error(exc: _ApiError) -> Response:
        body = {"error": {"message": exc.message, "type": exc.kind, "code": exc.status}}
        return JSONResponse(body, status_code=exc.status)

    async def parse(request: Request) -> dict[str, Any]:
        if config.api_key and request.headers.get("authorization") != f"Bearer {config.api_key}":
            raise _ApiError(401, "invalid or missing API key", "authentication_error")
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > config.max_request_bytes:
            raise _ApiError(413, f"request body over {config.max_request_bytes} bytes")
        raw = b""
        async for part in request.stream():
            raw += part
            if len(raw) > config.max_request_bytes:
                raise _ApiError(413, f"request body over {config.max_request_bytes} bytes")
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError as exc:
            raise _ApiError(400, f"request body is not JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise _ApiError(400, "request body must be a JSON object")
        return body

    def sampling(body: dict[str, Any]) -> Sampling:
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or 256
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise _ApiError(400, "max_tokens must be a positive integer")
        if max_tokens > config.max_tokens_limit:
            raise _ApiError(
                400,
                f"max_tokens {max_tokens} is over this server's limit of {config.max_tokens_limit}",
            )
        if body.get("n", 1) != 1:
            raise _ApiError(400, "only n=1 is supported")
        stop = body.get("stop") or ()
        stop = (stop,) if isinstance(stop, str) else tuple(stop)
        try:
            return Sampling(
                max_tokens=max_tokens,
                temperature=float(body.get("temperature", 0.8)),
                top_p=float(body.get("top_p", 0.95)),
                seed=body.get("seed"),
                stop=stop,
            )
        except (TypeError, ValueError) as exc:
            raise _ApiError(400, f"invalid sampling parameter: {exc}") from exc

    async def models(request: Request) -> Response:
        try:
            if (
                config.api_key
                and request.headers.get("authorization") != f"Bearer {config.api_key}"
            ):
                raise _ApiError(401, "invalid or missing API key", "authentication_error")
        except _ApiError as exc:
            return error(exc)
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": config.model_name,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "edgekit",
                    }
                ],
            }
        )

    async def completions(request: Request) -> Response:
        return await handle(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await handle(request, chat=True)

    async def handle(request: Request, *, chat: bool) -> Response:
        try:
            body = await parse(request)
            params = sampling(body)
            if chat:
                messages = body.get("messages")
                if not isinstance(messages, list) or not messages:
                    raise _ApiError(400, "messages must be a non-empty list")
                prompt_tokens = session.tokenize(session.render_chat(messages))
            else:
                prompt = body.get("prompt")
                if not isinstance(prompt, str):
                    raise _ApiError(400, "prompt must be a string")
                prompt_tokens = session.tokenize(prompt)
        except _ApiError as exc:
            return error(exc)
        except EdgekitError as exc:
            return error(_ApiError(400, str(exc)))
        if not admission.enter():
            stats.rejected_busy += 1
            return error(
                _ApiError(503, "the server is busy: the request queue is full", "server_busy")
            )
        stats.requests += 1
        ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        chunks = _generate(session, prompt_tokens, params)
        if body.get("stream"):
            return StreamingResponse(
                _sse(
                    chunks,
                    session,
                    admission,
                    stats,
                    chat=chat,
                    ident=ident,
                    created=created,
                    model=config.model_name,
                ),
                media_type="text/event-stream",
            )
        try:
            text, count, reason = await asyncio.to_thread(_collect, chunks)
        except EdgekitError as exc:
            return error(_ApiError(500, str(exc), "server_error"))
        finally:
            admission.leave()
        stats.finish_reasons.append(reason)
        usage = {
            "prompt_tokens": len(prompt_tokens),
            "completion_tokens": count,
            "total_tokens": len(prompt_tokens) + count,
        }
        choice: dict[str, Any] = {"index": 0, "finish_reason": _finish(reason), "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return JSONResponse(
            {
                "id": ident,
                "object": "chat.completion" if chat else "text_completion",
                "created": created,
                "model": config.model_name,
                "choices": [choice],
                "usage": usage,
            }
        )

    app = Starlette(
        routes=[
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        ]
    )
    app.state.stats = stats
    return app


def _generate(session: Session, tokens: list[int], sampling: Sampling) -> Iterator[StreamChunk]:
    """Chunks of one generation, holding the session's lock like Session.stream does."""
    with session._lock:
        session._start()
        yield from session.stream_tokens(tokens, sampling)


def _collect(chunks: Iterator[StreamChunk]) -> tuple[str, int, str]:
    text, count, reason = [], 0, "length"
    for c in chunks:
        text.append(c.text)
        count += c.tokens
        reason = c.finish_reason or reason
    return "".join(text), count, reason


def _finish(reason: str) -> str:
    return "length" if reason == "length" else "stop"


async def _sse(
    chunks: Iterator[StreamChunk],
    session: Session,
    admission: _Admission,
    stats: ServeStats,
    *,
    chat: bool,
    ident: str,
    created: int,
    model: str,
) -> AsyncIterator[str]:
    """Server-sent events from a generation running on a worker thread.

    If the client goes away, Starlette cancels this generator: the generation is then
    cancelled at its next token and the worker thread finishes before the slot is freed.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[StreamChunk | BaseException | None] = asyncio.Queue()

    def work() -> None:
        try:
            for chunk in chunks:
                loop.call_soon_threadsafe(queue.put_nowait, chunk)
        except BaseException as exc:  # delivered to the event loop, re-raised there
            loop.call_soon_threadsafe(queue.put_nowait, exc)
        finally:
            loop.call_soon_threadsafe(queue.put_nowait, None)

    worker = threading.Thread(target=work, name=f"edgekit-serve-{ident}", daemon=True)
    worker.start()
    kind = "chat.completion.chunk" if chat else "text_completion"

    def event(delta_text: str | None, finish: str | None, role: bool = False) -> str:
        if chat:
            delta: dict[str, Any] = (
                {"role": "assistant", "content": ""}
                if role
                else ({"content": delta_text} if delta_text is not None else {})
            )
            choice: dict[str, Any] = {
                "index": 0,
                "delta": delta,
                "finish_reason": finish,
                "logprobs": None,
            }
        else:
            choice = {
                "index": 0,
                "text": delta_text or "",
                "finish_reason": finish,
                "logprobs": None,
            }
        payload = {
            "id": ident,
            "object": kind,
            "created": created,
            "model": model,
            "choices": [choice],
        }
        return f"data: {json.dumps(payload)}\n\n"

    finished = False
    try:
        if chat:
            yield event(None, None, role=True)
        while True:
            item = await queue.get()
            if item is None:
                break
            if isinstance(item, BaseException):
                log.error("generation failed: %s", item)
                break
            if item.text:
                yield event(item.text, None)
            if item.finish_reason:
                stats.finish_reasons.append(item.finish_reason)
                yield event(None if chat else "", _finish(item.finish_reason))
        finished = True
        yield "data: [DONE]\n\n"
    finally:
        if not finished:
            stats.cancelled += 1
            session.cancel()
        await asyncio.to_thread(worker.join)
        admission.leave()


def serve(session: Session, config: ServeConfig) -> None:
    """Run the server until interrupted (blocking)."""
    import uvicorn

    uvicorn.run(create_app(session, config), host=config.host, port=config.port, log_level="info")
