"""Who uses a Session's runtime, and when: one generation (or one call that needs the
runtime to itself, such as ``logits``) at a time, the others in a first-come, first-served
queue.

Each user holds a ``Ticket``. A ticket withdrawn while it waits (its generation was
cancelled or closed) leaves the queue and never gets the session. The thread that holds
the session (a stream it has not finished) is refused a second turn with a
GenerationError: a re-entrant lock would run the second call inside the first and corrupt
it, and a plain lock would wait forever for itself. Other threads wait their turn.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from edgekit.errors import GenerationError

if TYPE_CHECKING:
    from edgekit.targets.handles import CancelToken, GenerationHandle

BUSY_HINT = (
    "read the stream to its end or call its close() before the next call on this session "
    "(a call from another thread would wait its turn)"
)


class Ticket:
    """One place in the queue. ``cancel`` is the generation's token (Session.cancel()
    sets it while this ticket holds the session); ``generation`` refers back to the
    handle, weakly, so that a dropped handle is freed and gives the session back."""

    __slots__ = ("cancel", "generation", "owner", "stepping", "withdrawn")

    def __init__(
        self, cancel: CancelToken | None = None, generation: GenerationHandle | None = None
    ) -> None:
        self.cancel = cancel
        self.generation = weakref.ref(generation) if generation is not None else None
        self.owner: int | None = None  # the thread driving it while it holds the session
        self.withdrawn = False  # cancelled or closed: it leaves the queue, never starts
        self.stepping = False  # its thread is inside the runtime now (Scheduler.step)


class Scheduler:
    """The lock and the FIFO queue of one Session."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[Ticket] = deque()
        self._holder: Ticket | None = None

    def enter(self, ticket: Ticket) -> bool:
        """Wait for ``ticket``'s turn. True: it holds the session now; False: it was
        withdrawn while waiting and has left the queue.

        Raises:
            GenerationError: this thread holds the session already.
        """
        me = threading.get_ident()
        with self._cond:
            if self._holder is not None and self._holder.owner == me:
                raise GenerationError(
                    "this session is busy: a stream (stream() or chat_stream()) on this "
                    "thread is not finished",
                    hint=BUSY_HINT,
                )
            self._queue.append(ticket)
            try:
                while not ticket.withdrawn and not self._is_next(ticket):
                    self._cond.wait()
            finally:  # also when the wait is interrupted (KeyboardInterrupt)
                self._queue.remove(ticket)
                self._cond.notify_all()  # whoever is first in line now
            if ticket.withdrawn:
                return False
            self._holder = ticket
            ticket.owner = me
            return True

    def _is_next(self, ticket: Ticket) -> bool:
        if self._holder is not None:
            return False
        first = next((t for t in self._queue if not t.withdrawn), None)
        return first is ticket

    def leave(self, ticket: Ticket) -> None:
        """``ticket`` gives the session back (a no-op when it does not hold it)."""
        with self._cond:
            if self._holder is ticket:
                self._holder = None
                ticket.owner = None
                self._cond.notify_all()

    def withdraw(self, ticket: Ticket) -> None:
        """A waiting ``ticket`` leaves the queue (its waiter wakes and sees it)."""
        with self._cond:
            ticket.withdrawn = True
            self._cond.notify_all()

    def claim(self, ticket: Ticket) -> None:
        """The thread resuming ``ticket``'s stream holds the session from now on."""
        if self._holder is ticket:
            ticket.owner = threading.get_ident()

    def waiting(self) -> int:
        """How many are queued now (withdrawn ones are on their way out)."""
        with self._cond:
            return sum(not t.withdrawn for t in self._queue)

    def holder(self) -> Ticket | None:
        """The ticket holding the session now (None: nobody)."""
        return self._holder

    def generations(self) -> list[GenerationHandle]:
        """The live handles holding the session or queued for it (what closing the
        session ends), taken under the lock and returned outside it: closing a handle
        takes the lock again."""
        with self._cond:
            tickets = [t for t in (self._holder, *self._queue) if t is not None]
        handles = [t.generation() for t in tickets if t.generation is not None]
        return [h for h in handles if h is not None]

    @contextmanager
    def step(self, ticket: Ticket) -> Iterator[None]:
        """While ``ticket``'s thread is inside the runtime (a token, opening or closing a
        stream): what the runtime calls of the session's own methods then runs within
        this turn (a subclass calling its parent's wrapped method), where the same call
        from outside a step takes a turn of its own, or is refused on this thread."""
        ticket.stepping = True
        try:
            yield
        finally:
            ticket.stepping = False

    def in_step_here(self) -> bool:
        holder = self._holder
        return holder is not None and holder.stepping and holder.owner == threading.get_ident()

    @contextmanager
    def turn(self) -> Iterator[None]:
        """Hold the session for one call (logits, clear_cache, close): after the
        generations queued before it, refused on the thread that holds it already; inside
        a step of the holder (the runtime calling itself), it is that step's turn."""
        if self.in_step_here():
            yield
            return
        ticket = Ticket()
        self.enter(ticket)  # never withdrawn: it always gets its turn
        try:
            with self.step(ticket):
                yield
        finally:
            self.leave(ticket)
