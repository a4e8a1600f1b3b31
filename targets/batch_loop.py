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

import itertools
import logging
import threading
import weakref
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgekit.targets.batch_generation import BatchedGeneration, End, mapped_error
from edgekit.targets.batching import BatchRuntime, SeqRequest
from edgekit.targets.generation import PromptMaker
from edgekit.targets.values import Sampling

from edgekit.errors import GenerationError

if TYPE_CHECKING:
    from edgekit.targets.session import Session

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class BatchStats:
    """What the loop holds now (for /health and /metrics)."""

    slots: int
    running: int
    waiting: int


def _loop_stopped() -> GenerationError:
    return GenerationError(
        "the batch loop stopped", hint="load the model again; run with -v to see why it stopped"
    )


class _Forget:
    """One ``forget_prefixes`` call waiting for the loop thread."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None

    def run(self, runtime: BatchRuntime) -> None:
        try:
            runtime.forget_prefixes()
        except Exception as exc:  # noqa: BLE001 - the caller gets it, the loop goes on
            self.error = mapped_error(exc, "dropping the cached prefixes")
        except BaseException as exc:  # the loop stops on it: the caller must not hang
            self.error = mapped_error(exc, "dropping the cached prefixes")
            raise
        finally:
            self.done.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.done.set()


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
        # Session.clear_cache asks the loop thread (the runtime's only caller) to drop the
        # kept prefixes between two steps, and waits for it
        self._forget: list[_Forget] = []
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

    def forget_prefixes(self) -> None:
        """Drop the prefixes the runtime keeps (between two steps, on the loop's thread);
        returns once they are gone.

        Raises:
            GenerationError: the runtime cannot drop them, or the session is closed.
        """
        request = _Forget()
        with self._cond:
            if self._stopping:
                raise GenerationError("the session is closed", hint="load the model again")
            self._forget.append(request)
            self._cond.notify_all()
        request.done.wait()
        if request.error is not None:
            raise request.error

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
                    # taken last, and each one's waiter is woken whatever happens in it
                    forget, self._forget = self._forget, []
                try:
                    for request in forget:
                        request.run(self._runtime)
                finally:  # one that raised through stops the loop: the rest are woken
                    for request in forget:
                        if not request.done.is_set():
                            request.fail(_loop_stopped())
                if busy:
                    self._step()
        except BaseException as exc:  # a bug here must not leave every reader waiting
            log.exception("the batch loop stopped")
            self._fail_all(mapped_error(exc, "the batch loop"))

    def _fail_all(self, error: BaseException) -> None:
        with self._cond:
            self._stopping = True
            pending = _alive([*self._running.values(), *self._waiting])
            self._running.clear()
            self._waiting.clear()
            forget, self._forget = self._forget, []
        for request in forget:
            request.fail(error)
        for generation in pending:
            generation.deliver(End(None, error))

    def _work(self) -> bool:
        return bool(self._running) or bool(self._waiting) or bool(self._forget)

    def _retire(self) -> None:
        """Remove from the runtime what ended, was cancelled or dropped, and from the queue
        what was cancelled or dropped while waiting (under the lock)."""
        for rid, ref in list(self._running.items()):
            generation = ref()
            if generation is None or generation.withdrawn or generation.done:
                self._drop(rid)
                if generation is not None:
                    generation.deliver(End("cancelled"))
        for ref in list(self._waiting):
            waiting = ref()
            if waiting is None or waiting.withdrawn:
                self._waiting.remove(ref)
                if waiting is not None:
                    waiting.deliver(End("cancelled"))

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
                generation.deliver(End("cancelled"))
                continue
            request = SeqRequest(
                rid=generation.rid, prompt=generation.prompt_ids, sampling=generation.sampling
            )
            try:
                self._runtime.add(request)
            except Exception as exc:  # noqa: BLE001 - this request fails, the loop goes on
                generation.deliver(End(None, mapped_error(exc, "adding a request")))
                continue
            self._running[generation.rid] = weakref.ref(generation)
            self._delivered[generation.rid] = 0
            generation.mark_running()

    def _step(self) -> None:
        try:
            steps = self._runtime.step()
        except Exception as exc:  # noqa: BLE001 - the step's requests fail, not the loop
            error = mapped_error(exc, "a batched step")
            with self._cond:
                failed = list(self._running.items())
                self._running.clear()
                self._delivered.clear()
            for rid, ref in failed:
                self._remove(rid)
                generation = ref()
                if generation is not None:
                    generation.deliver(End(None, error))
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
            forget, self._forget = self._forget, []
            self._cond.notify_all()
        for request in forget:
            request.fail(GenerationError("the session is closed", hint="load the model again"))
        if threading.current_thread() is not self._thread:
            self._thread.join()
        for generation in pending:  # as a single-stream session closes its handles
            generation.close()
        self._runtime.close()


def _alive(refs: Iterable[weakref.ref[BatchedGeneration]]) -> list[BatchedGeneration]:
    return [g for g in (ref() for ref in refs) if g is not None]
