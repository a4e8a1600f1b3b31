"""One generation of a batched session (targets/batch_loop.py): the handle its reader
holds, and the events the loop hands it (a step's tokens, or its end)."""

from __future__ import annotations

import contextlib
import queue
from collections.abc import Sequence
from typing import TYPE_CHECKING

from edgekit.targets.batch_text import TokenText
from edgekit.targets.batching import SeqStep
from edgekit.targets.generation import PromptMaker
from edgekit.targets.handles import RecordedGeneration
from edgekit.targets.values import FinishReason, Sampling, StreamChunk

from edgekit.errors import EdgekitError, GenerationError

if TYPE_CHECKING:
    from edgekit.targets.batch_loop import BatchLoop


class End:
    """The loop's last word to a generation: why it ended, or the error it failed with."""

    __slots__ = ("error", "reason")

    def __init__(self, reason: FinishReason | None, error: BaseException | None = None) -> None:
        self.reason, self.error = reason, error


def mapped_error(exc: BaseException, what: str) -> BaseException:
    if isinstance(exc, EdgekitError):
        return exc
    error = GenerationError(
        f"the batched runtime failed during {what}: {type(exc).__name__}: {exc}",
        hint="run with -v to see the runtime's log; if it repeats, load the model again",
    )
    error.__cause__ = exc
    return error


Event = SeqStep | End


class BatchedGeneration(RecordedGeneration):
    """One generation of a batched session. Its reader's first ``next()`` makes the prompt
    and queues the request; each ``next()`` then returns the next chunk the loop gave it
    (waiting for it). ``cancel``/``close`` from any thread: a queued request leaves the
    queue, a running one leaves the batch at the next step; close returns at once."""

    def __init__(self, loop: BatchLoop, prompt: PromptMaker, sampling: Sampling) -> None:
        super().__init__()
        self._loop = loop
        self._make_prompt = prompt
        self.sampling = sampling
        self.rid = 0
        self.prompt_ids: tuple[int, ...] = ()
        self._events: queue.Queue[Event | None] = queue.Queue()
        self.withdrawn = False  # cancelled or closed: the loop drops it
        self.done = False  # it ended here (stop string, max_tokens): the loop frees it
        self._text: TokenText | None = None
        self.cached_tokens = 0  # prompt tokens the runtime reused from a cached prefix
        self.token_ids: list[int] = []  # the generated ids, as the runtime gave them

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def ended(self) -> bool:
        """Read to its end (or closed): no chunk will come any more."""
        return self._ended

    # --- the loop's side ------------------------------------------------------------------

    def deliver(self, event: Event) -> None:
        self._events.put(event)

    def mark_running(self) -> None:
        self._started = True
        if self._state == "queued":
            self._state = "running"

    # --- the reader's side ----------------------------------------------------------------

    def __next__(self) -> StreamChunk:
        if self._ended:
            raise StopIteration
        if self._closed:  # closed: nothing more, whatever the loop had handed it
            return self._stop_closed()
        if self._state == "pending":
            self._begin()
            if self._ended:  # withdrawn before it was queued
                return self._final("cancelled")
        while True:
            event = self._events.get()
            if event is None or self._closed:  # closed: woken to end
                return self._stop_closed()
            chunk = self._consume(event)
            if chunk is not None:
                return chunk

    def _begin(self) -> None:
        if self.withdrawn:
            self._ended, self._state = True, "closed" if self._closed else "finished"
            return
        try:
            with self._loop.readers:  # the session's close waits for this
                self._loop.session()._refuse_closed()
                ids = self._make_prompt()
            if len(ids) >= self._loop.context:
                raise GenerationError(
                    f"the prompt has {len(ids)} tokens; a sequence holds {self._loop.context}",
                    hint="shorten the prompt or load with a larger context",
                )
            self.prompt_ids = tuple(ids)
            self._text = TokenText(self._detokenize, self.sampling.stop, self.prompt_ids)
            self._state = "queued"
            self._loop._submit(self)
        except BaseException as exc:
            self._error, self._ended, self._state = exc, True, "finished"
            raise

    def _detokenize(self, ids: Sequence[int]) -> str:
        """The session's detokenize, never on a closed (freed) session: text after the
        close is moot, so it is empty."""
        with self._loop.readers:
            session = self._loop._session()
            if session is None or session._ended:
                return ""
            return session.detokenize(ids)

    def _consume(self, event: Event) -> StreamChunk | None:
        if isinstance(event, End):
            if event.error is not None:
                self._error, self._ended, self._state = event.error, True, "finished"
                raise event.error
            if self._closed:
                return self._stop_closed()
            return self._final(event.reason or "cancelled")
        if self.done or self.withdrawn:
            return None  # steps that raced the end: the loop frees the slot
        if event.cached:
            self.cached_tokens = event.cached
        room = self.sampling.max_tokens - self._count
        ids = event.tokens[:room]
        text, stopped = self._text.feed(ids) if self._text is not None else ("", False)
        self._count += len(ids)
        self.token_ids.extend(ids)
        self._pieces.append(text)
        if stopped:
            return self._end_here(text, len(ids), "stop")
        if event.end is not None or self._count >= self.sampling.max_tokens:
            reason: FinishReason = event.end or "length"
            tail = self._text.flush() if self._text is not None else ""
            self._pieces.append(tail)
            return self._end_here(text + tail, len(ids), reason)
        if not ids:
            return None
        return StreamChunk(text=text, tokens=len(ids))

    def _end_here(self, text: str, tokens: int, reason: FinishReason) -> StreamChunk:
        """The generation ended on this side (stop string, max_tokens, end of sequence):
        the loop frees its slot at the next step."""
        self.done, self._ended, self._reason, self._state = True, True, reason, "finished"
        self._loop._wake()
        return StreamChunk(text=text, tokens=tokens, finish_reason=reason)

    def _final(self, reason: FinishReason) -> StreamChunk:
        tail = self._text.flush() if self._text is not None else ""
        self._pieces.append(tail)
        self._ended, self._reason = True, reason
        self._state = "closed" if self._closed else "finished"
        return StreamChunk(text=tail, tokens=0, finish_reason=reason)

    def _stop_closed(self) -> StreamChunk:
        self._ended, self._state = True, "closed"
        raise StopIteration

    def cancel(self) -> None:
        if self._ended and not self._closed:
            return
        self.withdrawn = True
        # the reader skips what the loop handed it before and ends on this (the loop may
        # have let the request go already: it reached max_tokens in the runtime)
        self._events.put(End("cancelled"))
        self._loop._wake()

    def close(self) -> None:
        self._closed = True
        self.cancel()
        if not self._ended:
            self._events.put(None)  # wake a reader waiting for its next chunk
        if self._state == "pending":
            self._ended, self._state = True, "closed"

    def __del__(self) -> None:
        # a dropped stream leaves the batch: the loop holds it weakly, and drops its slot
        # at the next step
        with contextlib.suppress(Exception):
            if not getattr(self, "_ended", True):
                self.close()
