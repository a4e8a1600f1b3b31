"""The local GenerationHandle: one generation of a Session in this process.

The generation runs on whichever thread reads it: its first ``next()`` waits for its turn
in the session's scheduler, prepares the prompt (tokenizes it, or renders the chat
template) and opens the runtime's stream; each ``next()`` then computes a token. A step
lock tells ``close()`` whether a reader is inside the runtime right now: if not, close
ends the stream itself; if so, it only marks the handle closed and cancels it, and the
reader ends the stream when its token is done. Either way close returns at once.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from edgekit.targets.handles import CancelToken, RecordedGeneration
from edgekit.targets.runtime_calls import close_iterator
from edgekit.targets.scheduler import Ticket
from edgekit.targets.values import Sampling, StreamChunk

if TYPE_CHECKING:
    from edgekit.targets.session import Session

# Makes the prompt's token ids at the generation's turn (tokenize, or a chat template).
PromptMaker = Callable[[], list[int]]


class LocalGeneration(RecordedGeneration):
    def __init__(self, session: Session, prompt: PromptMaker, sampling: Sampling) -> None:
        super().__init__()
        self._session = session
        self._scheduler = session._scheduler
        self._make_prompt = prompt
        self._sampling = sampling
        self._token = CancelToken()
        self._ticket = Ticket(cancel=self._token, generation=self)
        self._step = threading.Lock()  # held by the thread inside __next__
        self._chunks: Iterator[StreamChunk] | None = None
        self._prompt = 0

    # --- what callers read ---------------------------------------------------------------

    @property
    def prompt_tokens(self) -> int:
        return self._prompt

    def __next__(self) -> StreamChunk:
        with self._step:
            if self._ended:
                raise StopIteration
            if self._state == "pending":
                return self._begin()
            self._scheduler.claim(self._ticket)  # resumed, perhaps on another thread
            return self._advance()

    def cancel(self) -> None:
        self._token.set()
        self._scheduler.withdraw(self._ticket)  # queued: it leaves the queue

    def close(self) -> None:
        self._closed = True
        self.cancel()
        if self._step.acquire(blocking=False):  # nobody is inside the runtime: end it here
            try:
                if not self._ended:
                    self._finish()
            finally:
                self._step.release()
        # else: the reader inside __next__ ends the stream when its token is done

    def __del__(self) -> None:
        # A dropped stream gives the session back (the scheduler refers to it weakly).
        if not getattr(self, "_ended", True):
            with contextlib.suppress(Exception):
                self.close()

    # --- the steps, always under the step lock ---------------------------------------------

    def _begin(self) -> StreamChunk:
        """Wait for the turn, prepare the prompt, open the runtime's stream, first chunk."""
        if self._token.is_set():  # cancelled or closed before it asked for its turn
            return self._end_unstarted()
        self._state = "queued"
        try:
            admitted = self._scheduler.enter(self._ticket)
        except BaseException:
            self._ended, self._state = True, "finished"
            raise
        if not admitted:
            return self._end_unstarted()
        try:
            self._session._refuse_closed()  # made before its session closed, begun after
        except BaseException as exc:
            self._error, self._ended, self._state = exc, True, "finished"
            self._scheduler.leave(self._ticket)
            raise
        self._state, self._started = "running", True
        try:
            with self._scheduler.step(self._ticket):
                ids = self._make_prompt()
                self._prompt = len(ids)
                self._chunks = iter(self._session.stream_tokens(ids, self._sampling))
        except BaseException as exc:
            self._fail(exc)
            raise
        return self._advance()

    def _end_unstarted(self) -> StreamChunk:
        """A generation withdrawn before its turn: it never reaches the runtime."""
        self._ended = True
        self._state = "closed" if self._closed else "finished"
        if self._closed:
            raise StopIteration
        self._reason = "cancelled"
        return StreamChunk(text="", tokens=0, finish_reason="cancelled")

    def _advance(self) -> StreamChunk:
        chunks = self._chunks
        if chunks is None:  # ended by close() between two steps
            self._ended = True
            raise StopIteration
        try:
            with self._scheduler.step(self._ticket):
                chunk = next(chunks)
        except StopIteration:
            self._finish()
            raise
        except BaseException as exc:
            self._fail(exc)
            raise
        if self._closed:  # closed from another thread during this step
            self._finish()
            raise StopIteration
        self._pieces.append(chunk.text)
        self._count += chunk.tokens
        if chunk.finish_reason is not None:
            self._reason = chunk.finish_reason
            self._finish()  # the last chunk: the session goes to the next in line now
        return chunk

    def _fail(self, exc: BaseException) -> None:
        self._error = exc
        with contextlib.suppress(Exception):  # the failure is what the caller must see
            self._finish()

    def _finish(self) -> None:
        """End the runtime's stream and give the session back."""
        self._ended = True
        chunks, self._chunks = self._chunks, None
        try:
            if chunks is not None:
                with self._scheduler.step(self._ticket):
                    close_iterator(chunks)
        finally:
            self._state = "closed" if self._closed else "finished"
            if self._started:
                self._scheduler.leave(self._ticket)
