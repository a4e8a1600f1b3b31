"""One generation request of ``edgekit serve``, below the routing: the connection watch,
the generation read on a thread of its own, and the answer it becomes (one JSON body,
or server-sent events).

The generation is the Session's own handle (``Session.start``), so the server keeps no
queue or lock of its own and touches no Session internals: the handle waits its turn in
the session's scheduler, and the client's going away closes that handle only. Queued, it
leaves the queue and never starts; running, it stops at its next token. Another client's
generation is never touched.

A failed generation ends its stream with an error event (``data: {"error": {...}}``),
never ``[DONE]``; a non-streaming one is answered with its status (500, or 400 when the
runtime refused what the request asked for) and the message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, TypeVar

from edgekit.errors import EdgekitError, SettingError
from edgekit.serve_http import Receive, Responder, error_body
from edgekit.serve_requests import GenerationRequest
from edgekit.targets.handles import GenerationHandle
from edgekit.targets.values import StreamChunk

T = TypeVar("T")

GONE = object()  # posted to a request's inbox when its client disconnects
DONE = object()  # posted by a generation's thread when it has finished


class Client:
    """Watches one request's connection (after its body was read): posts ``GONE`` to the
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
                self.inbox.put_nowait(GONE)
                return

    def close(self) -> None:
        self._task.cancel()


class GenerationThread:
    """Reads one generation's handle on a thread of its own (its first chunk waits for its
    turn in the session). Its chunks, a failure, then ``DONE`` go to the request's inbox
    on the event loop."""

    def __init__(self, handle: GenerationHandle, inbox: asyncio.Queue[object]) -> None:
        self.handle = handle
        self.inbox = inbox
        self.loop = asyncio.get_running_loop()
        self.done = False
        self.thread = threading.Thread(
            target=self._run, name="edgekit-serve-generation", daemon=True
        )

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """This request's own generation ends: queued, it leaves the queue; running, it
        stops at its next token. Returns at once."""
        if not self.done:
            self.handle.close()

    def _post(self, item: object) -> None:
        with contextlib.suppress(RuntimeError):  # the event loop is closed: the server stopped
            self.loop.call_soon_threadsafe(self.inbox.put_nowait, item)

    def _run(self) -> None:
        try:
            for chunk in self.handle:
                self._post(chunk)
        except BaseException as exc:  # noqa: BLE001 - delivered to the event loop
            self._post(exc)
        finally:
            self.done = True
            self._post(DONE)


async def in_thread(fn: Callable[[GenerationRequest], T], arg: GenerationRequest) -> T:
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


def failure_status(exc: BaseException) -> tuple[int, str]:
    # A SettingError from the runtime is about what the request asked for.
    return (
        (400, "invalid_request_error") if isinstance(exc, SettingError) else (500, "server_error")
    )


def failure_text(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, EdgekitError) else f"generation failed: {type(exc).__name__}"


class Answer(ABC):
    """How one generation's chunks become the answer: collected, or streamed."""

    def __init__(
        self, out: Responder, request: GenerationRequest, model: str, prompt_tokens: int
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
        status, kind = failure_status(exc)
        await self.out.error(status, failure_text(exc), kind)


def answer_for(
    out: Responder, request: GenerationRequest, model: str, prompt_tokens: int
) -> Answer:
    kind = EventStream if request.stream else Collected
    return kind(out, request, model, prompt_tokens)


class Collected(Answer):
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


class EventStream(Answer):
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
        status, kind = failure_status(exc)
        await self._event(error_body(status, failure_text(exc), kind, None))
        await self.out.body(b"", more=False)
