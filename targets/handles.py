"""A generation as a handle: what ``Session.start`` returns.

A handle is one generation, with its own cancel token: iterate it for its StreamChunks,
or call ``result()`` for the whole Generation. Its life, on any Session:

    pending   made by ``start``: arguments checked, nothing queued yet
    queued    its first chunk was asked for; it waits its turn (first come, first served)
    running   it holds the session; the runtime generates its tokens
    finished  it ended (stop, length, cancelled, or an error); the session went on
    closed    ``close()`` ended it, or it was dropped before its end

``cancel()`` stops this generation, from any thread: running, at its next token (the
stream ends with a chunk whose ``finish_reason`` is "cancelled"); pending or queued, it
leaves the queue and never starts (the stream is then just that last chunk). ``close()``
returns at once, from any thread and on every target: the generation stops, the stream
yields nothing more and the session goes to the next in line (a closed queued handle
never starts). Dropping an unfinished handle closes it.

This is the seam between the API and a runtime: a local Session implements it over the
runtime in this process (targets/generation.py); a remote session implements the same
interface over the network.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from types import TracebackType
from typing import Literal, Self

from edgekit.targets.values import FinishReason, Generation, StreamChunk

HandleState = Literal["pending", "queued", "running", "finished", "closed"]


class CancelToken:
    """Whether one generation was asked to stop: set from any thread, read by the runtime
    at every token."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()


class ClosedOnExit(ABC):
    """``with x:`` closes ``x`` on the way out, however the block ends (sessions, handles)."""

    @abstractmethod
    def close(self) -> None:
        """Release what ``x`` holds; idempotent."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class GenerationHandle(ClosedOnExit, Iterator[StreamChunk]):
    """One generation (see the module text for its life). Iterating it yields its chunks;
    the last one carries the finish reason."""

    @property
    @abstractmethod
    def state(self) -> HandleState:
        """Where the generation is now: pending, queued, running, finished or closed."""

    @property
    @abstractmethod
    def started(self) -> bool:
        """Whether the runtime began this generation (False: it was cancelled, closed or
        refused before its turn came)."""

    @property
    @abstractmethod
    def prompt_tokens(self) -> int:
        """The prompt's length in tokens (0 until the generation has started)."""

    @abstractmethod
    def __next__(self) -> StreamChunk:
        """The next chunk; it waits for the generation's turn first when it has not begun.

        Raises:
            GenerationError: the runtime failed (mapped from its own exception), or this
                thread holds the session with a stream it has not finished.
            SettingError: the prompt was refused (it does not fit, a template's checks).
        """

    @abstractmethod
    def cancel(self) -> None:
        """Stop this generation at its next token, or before it starts (from any thread)."""

    @abstractmethod
    def close(self) -> None:
        """End this generation now and let the session go to the next in line. Returns at
        once, from any thread; idempotent."""

    @abstractmethod
    def result(self) -> Generation:
        """Read what is left of the stream and return the whole generation (what was
        already iterated is included). Re-raises the generation's failure."""


class RecordedGeneration(GenerationHandle):
    """A handle that keeps what its stream said (the text pieces, the token count, why it
    ended or the error it failed with) as its chunks go by, so ``result`` is one thing for
    every kind of generation."""

    def __init__(self) -> None:
        self._state: HandleState = "pending"
        self._started = False
        self._closed = False
        self._ended = False  # no chunk will come any more
        self._pieces: list[str] = []
        self._count = 0
        self._reason: FinishReason | None = None
        self._error: BaseException | None = None

    @property
    def state(self) -> HandleState:
        return self._state

    @property
    def started(self) -> bool:
        return self._started

    def result(self) -> Generation:
        for _ in self:
            pass
        if self._error is not None:
            raise self._error
        return Generation(
            text="".join(self._pieces),
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self._count,
            finish_reason=self._reason or ("cancelled" if self._closed else "length"),
        )
