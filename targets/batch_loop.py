"""Continuous batching: one thread drives a BatchRuntime (targets/batching.py) for a
Session, so several generations run at once on one loaded model.

Between two steps the loop removes the sequences that ended, were cancelled or closed,
and adds waiting requests while slots are free (first come, first served): a new request
joins the running batch at the next step, a finished one leaves it. Each generation is a
``BatchedGeneration`` handle, the same GenerationHandle as a single-stream session's: its
reader prepares the prompt (tokenizer or chat template, on the reader's thread), queues
it, and reads the chunks the loop hands it; text, stop strings and ``max_tokens`` are
applied here, per request, so every runtime behaves the same. A runtime failure in a step
fails the requests of that step; the loop keeps serving the others, and new requests.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgekit.targets.batch_text import TokenText
from edgekit.targets.batching import BatchRuntime, SeqRequest, SeqStep
from edgekit.targets.handles import GenerationHandle, HandleState
from edgekit.targets.values import FinishReason, Generation, Sampling, StreamChunk

from edgekit.errors import EdgekitError, GenerationError

if TYPE_CHECKING:
    from edgekit.targets.session import Session

log = logging.getLogger(__name__)

PromptMaker = Callable[[], list[int]]


@dataclass(frozen=True, kw_only=True)
class BatchStats:
    """What the loop holds now (for /health and /metrics)."""

    slots: int
    running: int
    waiting: int


class _End:
    """The loop's last word to a generation: why it ended, or the error it failed with."""

    __slots__ = ("error", "reason")

    def __init__(self, reason: FinishReason | None, error: BaseException | None = None) -> None:
        self.reason, self.error = reason, error


class BatchLoop:
    """The thread that owns ``runtime`` (see the module text)."""

    def __init__(self, runtime: BatchRuntime, session: Session) -> None:
        self._runtime = runtime
        # weakly: a batched session its owner dropped unclosed is freed (and the loop with
        # it, by the finalizer), as a single-stream one is
        self._session = weakref.ref(session)
        # held by readers around the session's tokenizer calls (prompt, text) and by the
        # session's close around freeing the runtime: a reader never detokenizes on a
        # freed model (a single-stream reader holds the scheduler's turn for that)
        self.readers = threading.RLock()
        self._cond = threading.Condition()
        # weakly held, as the single-stream scheduler holds its tickets: a stream its
        # reader dropped leaves the batch (its __del__ closes it; a dead ref counts too)
        self._waiting: deque[weakref.ref[BatchedGeneration]] = deque()
        self._running: dict[int, weakref.ref[BatchedGeneration]] = {}
        self._ids = itertools.count(1)
        self._delivered: dict[int, int] = {}  # tokens handed to each running request
        # every generation queued and not yet read to its end (closing the loop closes
        # them: one the runtime finished may still have chunks its reader has not read)
        self._all: weakref.WeakSet[BatchedGeneration] = weakref.WeakSet()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="edgekit-batch", daemon=True)
        self._thread.start()
        weakref.finalize(session, self.close)

    @property
    def slots(self) -> int:
        return self._runtime.slots

    @property
    def context(self) -> int:
        return self._runtime.context

    def stats(self) -> BatchStats:
        with self._cond:
            return BatchStats(
                slots=self._runtime.slots, running=len(self._running), waiting=len(self._waiting)
            )

    def generation(self, prompt: PromptMaker, sampling: Sampling) -> BatchedGeneration:
        return BatchedGeneration(self, prompt, sampling)

    def cancel_running(self) -> None:
        """Cancel every generation running now (Session.cancel); queued ones stay."""
        with self._cond:
            running = _alive(self._running.values())
        for generation in running:
            generation.cancel()

    def generations(self) -> list[BatchedGeneration]:
        """The generations queued, running or not yet read to their end."""
        with self._cond:
            return [g for g in list(self._all) if not g.ended]

    # --- called by the generations ------------------------------------------------------

    def session(self) -> Session:
        """The session this loop serves.

        Raises:
            GenerationError: it is gone (closed and dropped).
        """
        session = self._session()
        if session is None:
            raise GenerationError("the session is closed", hint="load the model again")
        return session

    def _submit(self, generation: BatchedGeneration) -> None:
        with self._cond:
            if self._stopping:
                raise GenerationError("the session is closed", hint="load the model again")
            generation.rid = next(self._ids)  # set before the loop can see it
            self._waiting.append(weakref.ref(generation))
            self._all.add(generation)
            self._cond.notify_all()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # --- the loop -------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._stopping and not self._work():
                        self._cond.wait()
                    if self._stopping:
                        break
                    self._retire()
                    self._admit()
                    busy = bool(self._running)
                if busy:
                    self._step()
        except BaseException as exc:  # a bug here must not leave every reader waiting
            log.exception("the batch loop stopped")
            self._fail_all(_mapped(exc, "the batch loop"))

    def _fail_all(self, error: BaseException) -> None:
        with self._cond:
            self._stopping = True
            pending = _alive([*self._running.values(), *self._waiting])
            self._running.clear()
            self._waiting.clear()
        for generation in pending:
            generation.deliver(_End(None, error))

    def _work(self) -> bool:
        return bool(self._running) or bool(self._waiting)

    def _retire(self) -> None:
        """Remove from the runtime what ended, was cancelled or dropped, and from the queue
        what was cancelled or dropped while waiting (under the lock)."""
        for rid, ref in list(self._running.items()):
            generation = ref()
            if generation is None or generation.withdrawn or generation.done:
                self._drop(rid)
                if generation is not None:
                    generation.deliver(_End("cancelled"))
        for ref in list(self._waiting):
            waiting = ref()
            if waiting is None or waiting.withdrawn:
                self._waiting.remove(ref)
                if waiting is not None:
                    waiting.deliver(_End("cancelled"))

    def _drop(self, rid: int) -> None:
        """``rid`` leaves the batch now (under the lock)."""
        self._running.pop(rid, None)
        self._delivered.pop(rid, None)
        self._remove(rid)

    def _admit(self) -> None:
        """Add waiting requests while slots are free (under the lock)."""
        while self._waiting and len(self._running) < self._runtime.slots:
            generation = self._waiting.popleft()()
            if generation is None:
                continue
            if generation.withdrawn:
                generation.deliver(_End("cancelled"))
                continue
            request = SeqRequest(
                rid=generation.rid, prompt=generation.prompt_ids, sampling=generation.sampling
            )
            try:
                self._runtime.add(request)
            except Exception as exc:  # noqa: BLE001 - this request fails, the loop goes on
                generation.deliver(_End(None, _mapped(exc, "adding a request")))
                continue
            self._running[generation.rid] = weakref.ref(generation)
            self._delivered[generation.rid] = 0
            generation.mark_running()

    def _step(self) -> None:
        try:
            steps = self._runtime.step()
        except Exception as exc:  # noqa: BLE001 - the step's requests fail, not the loop
            error = _mapped(exc, "a batched step")
            with self._cond:
                failed = list(self._running.items())
                self._running.clear()
                self._delivered.clear()
            for rid, ref in failed:
                self._remove(rid)
                generation = ref()
                if generation is not None:
                    generation.deliver(_End(None, error))
            return
        with self._cond:
            for out in steps:
                held = self._running.get(out.rid)
                alive = held() if held is not None else None
                if alive is None:
                    continue
                alive.deliver(out)
                # ended or at max_tokens: it leaves the batch now, not when its reader
                # gets there (a slow reader must not keep a slot decoding)
                count = self._delivered.get(out.rid, 0) + len(out.tokens)
                self._delivered[out.rid] = count
                if out.end is not None or count >= alive.sampling.max_tokens:
                    self._drop(out.rid)

    def _remove(self, rid: int) -> None:
        try:
            self._runtime.remove(rid)
        except Exception as exc:  # noqa: BLE001 - a slot that will not free is logged
            log.warning("the batch runtime did not free request %d: %s", rid, exc)

    # --- lifetime -------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the loop (every generation not finished ends cancelled), then free the
        runtime. Idempotent."""
        with self._cond:
            self._stopping = True
            pending = [g for g in list(self._all) if not g.ended]
            self._running.clear()
            self._waiting.clear()
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join()
        for generation in pending:  # as a single-stream session closes its handles
            generation.close()
        self._runtime.close()


def _alive(refs: Iterable[weakref.ref[BatchedGeneration]]) -> list[BatchedGeneration]:
    return [g for g in (ref() for ref in refs) if g is not None]


def _mapped(exc: BaseException, what: str) -> BaseException:
    if isinstance(exc, EdgekitError):
        return exc
    error = GenerationError(
        f"the batched runtime failed during {what}: {type(exc).__name__}: {exc}",
        hint="run with -v to see the runtime's log; if it repeats, load the model again",
    )
    error.__cause__ = exc
    return error


Event = SeqStep | _End


class BatchedGeneration(GenerationHandle):
    """One generation of a batched session. Its reader's first ``next()`` makes the prompt
    and queues the request; each ``next()`` then returns the next chunk the loop gave it
    (waiting for it). ``cancel``/``close`` from any thread: a queued request leaves the
    queue, a running one leaves the batch at the next step; close returns at once."""

    def __init__(self, loop: BatchLoop, prompt: PromptMaker, sampling: Sampling) -> None:
        self._loop = loop
        self._make_prompt = prompt
        self.sampling = sampling
        self.rid = 0
        self.prompt_ids: tuple[int, ...] = ()
        self._events: queue.Queue[Event | None] = queue.Queue()
        self._state: HandleState = "pending"
        self._started = False
        self.withdrawn = False  # cancelled or closed: the loop drops it
        self.done = False  # it ended here (stop string, max_tokens): the loop frees it
        self._closed = False
        self._ended = False
        self._text: TokenText | None = None
        self._pieces: list[str] = []
        self._count = 0
        self._reason: FinishReason | None = None
        self._error: BaseException | None = None
        self.cached_tokens = 0  # prompt tokens the runtime reused from a cached prefix
        self.token_ids: list[int] = []  # the generated ids, as the runtime gave them

    @property
    def state(self) -> HandleState:
        return self._state

    @property
    def started(self) -> bool:
        return self._started

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
        if isinstance(event, _End):
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
        self._events.put(_End("cancelled"))
        self._loop._wake()

    def close(self) -> None:
        self._closed = True
        self.cancel()
        if not self._ended:
            self._events.put(None)  # wake a reader waiting for its next chunk
        if self._state == "pending":
            self._ended, self._state = True, "closed"

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

    def __del__(self) -> None:
        # a dropped stream leaves the batch: the loop holds it weakly, and drops its slot
        # at the next step
        with contextlib.suppress(Exception):
            if not getattr(self, "_ended", True):
                self.close()
