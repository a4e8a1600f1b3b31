"""The Session every runtime implements: one loaded model. Generate, stream, chat,
tokenize, logits, close.

Generations are handles (targets/handles.py): ``start`` returns one for a prompt (text,
token ids or chat messages); ``stream``, ``stream_from_tokens``, ``chat_stream`` return
it, and ``generate`` and ``chat`` read it to its end. A scheduler inside the Session
(targets/scheduler.py) owns the runtime: one generation at a time, the others queued
first come, first served; a handle cancelled or closed while queued leaves the queue and
never starts. The thread that holds the session (a stream it has not finished) is
refused a second call with a GenerationError. ``cancel()`` stops the generation running
now, whoever started it.

A runtime implements ``tokenize``, ``detokenize``, ``stream_tokens``, ``render_chat``,
``logits`` and ``_close`` (and may override ``clear_cache``); they are wrapped when the
class is defined (targets/runtime_calls.py), so their arguments are checked and their
backend exceptions become edgekit errors however they are reached. ``stream_tokens``
reads ``self._cancel``, the running generation's cancel token, at every token.

Errors: ``load`` raises SettingError (a setting of the wrong type or out of range),
TargetUnavailableError (SDK missing), ModelFormatError (the file is not a model this
target loads) or GenerationError (the runtime refused it); calls raise SettingError for
bad arguments and GenerationError for everything the runtime does wrong.
"""

from __future__ import annotations

import contextlib
from abc import abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from edgekit.targets import checks
from edgekit.targets.batch_loop import BatchLoop, BatchStats
from edgekit.targets.batching import BatchRuntime
from edgekit.targets.generation import LocalGeneration, PromptMaker
from edgekit.targets.handles import CancelToken, ClosedOnExit, GenerationHandle
from edgekit.targets.runtime_calls import (
    backend_errors,
    target_of,
    vocab_size,
    wrap_runtime_methods,
)
from edgekit.targets.scheduler import Scheduler
from edgekit.targets.text import protect_messages, split_control_text
from edgekit.targets.values import (
    Generation,
    Sampling,
    SessionInfo,
    StreamChunk,
    sampling_from,
)

from edgekit.errors import GenerationError

if TYPE_CHECKING:
    import numpy as np

# What a generation starts from: a prompt, its token ids, or chat messages.
Prompt = str | Sequence[int] | Sequence[Mapping[str, Any]]


class Session(ClosedOnExit):
    """One loaded model. Use as a context manager, or call ``close``.

    ``bundle`` and ``variant`` are set when the session came from ``edgekit.load``.
    """

    info: SessionInfo
    bundle: Any = None
    variant: Any = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        wrap_runtime_methods(cls)

    def __init__(self) -> None:
        self._scheduler = Scheduler()
        self._ended = False  # closed: no generation may start (the runtime is freed)
        # continuous batching (``_use_batching``): generations run together in a loop
        self._batch: BatchLoop | None = None

    def _use_batching(self, runtime: BatchRuntime) -> None:
        """From now on generations run through ``runtime``, several at once, on a loop
        thread of their own (targets/batch_loop.py); ``logits`` keeps the single-stream
        runtime, ``clear_cache`` clears it and the batch's kept prefixes. A target's ``load``
        calls this for ``parallel`` > 1."""
        self._batch = BatchLoop(runtime, self)

    @property
    def parallel(self) -> int:
        """How many generations run at once (1: one at a time, the others queued)."""
        return self._batch.slots if self._batch is not None else 1

    def batch_stats(self) -> BatchStats | None:
        """Running and waiting generations of a batched session (None: not batched)."""
        return self._batch.stats() if self._batch is not None else None

    @property
    def _cancel(self) -> CancelToken:
        """The cancel token of the generation holding the session (what ``stream_tokens``
        reads at every token); outside a generation, one that is never set."""
        holder = self._scheduler.holder()
        token = holder.cancel if holder is not None else None
        return token if token is not None else CancelToken()

    def cancel(self) -> None:
        """Stop the generation running now (from any thread) at its next token; on a
        batched session, every generation running now. Queued generations are not
        touched: cancel one through its own handle."""
        holder = self._scheduler.holder()
        if holder is not None and holder.cancel is not None:
            holder.cancel.set()
        if self._batch is not None:
            self._batch.cancel_running()

    # --- what each runtime implements (called with checked arguments) --------------------

    @abstractmethod
    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special`` adds BOS where the model wants it.
        Control tokens written in ``text`` are parsed (the caller wrote the whole prompt);
        chat messages go through ``chat_tokens``, where they are not."""

    @abstractmethod
    def detokenize(self, tokens: Sequence[int]) -> str: ...

    @abstractmethod
    def stream_tokens(
        self, prompt_tokens: Sequence[int], sampling: Sampling
    ) -> Iterator[StreamChunk]:
        """Generate from token ids, yielding text as it becomes complete UTF-8; stop with a
        "cancelled" chunk when ``self._cancel`` is set. Called from outside a generation,
        it starts one of its own (a handle), which waits its turn."""

    @abstractmethod
    def render_chat(self, messages: Sequence[dict[str, str]]) -> str:
        """The model's own chat template applied to ``messages`` (generation prompt added)."""

    @abstractmethod
    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Logits for every position of ``tokens`` (shape: len(tokens) x vocabulary)."""

    @abstractmethod
    def _close(self) -> None: ...

    def _control_texts(self) -> Sequence[str]:
        """The texts of the model's control tokens (``<|im_start|>``, ``<s>``, ...), which
        message text may contain but must not produce. Runtimes that can tell override it."""
        return ()

    def _text_tokens(self, text: str) -> list[int]:
        """Token ids of ``text`` written as plain text, control tokens not parsed. This
        default, for tokenizers that always parse them, encodes pieces none of which holds
        a control token's text; a runtime with a switch for it overrides this."""
        ids: list[int] = []
        for piece in split_control_text(text, self._control_texts()):
            ids += self.tokenize(piece, add_special=False)
        return ids

    # --- the public generation API, the same on every target ---------------------------

    def start(
        self, prompt: Prompt, sampling: Sampling | None = None, **overrides: Any
    ) -> GenerationHandle:
        """A generation of ``prompt``: text, token ids (from ``tokenize`` or
        ``chat_tokens``) or chat messages. Arguments are checked now; the generation joins
        the queue when its first chunk is asked for, and holds the session from its turn
        until it ends, is cancelled, closed or dropped."""
        self._refuse_closed()
        params = sampling_from(sampling, overrides)
        if self._batch is not None:
            return self._batch.generation(self._prompt_maker(prompt), params)
        return LocalGeneration(self, self._prompt_maker(prompt), params)

    def _refuse_closed(self) -> None:
        """Refuse a generation on a closed session: whatever the target, its runtime is
        freed (a plug-in that forgot its own check would run on freed memory).

        Raises:
            GenerationError: the session is closed.
        """
        if self._ended:
            raise GenerationError("the session is closed", hint="load the model again")

    def _prompt_maker(self, prompt: Prompt) -> PromptMaker:
        """What makes the prompt's token ids at the generation's turn (checked now)."""
        if isinstance(prompt, str):
            text = checks.prompt(prompt)
            return lambda: self.tokenize(text)
        if isinstance(prompt, Sequence) and prompt and isinstance(prompt[0], Mapping):
            messages = checks.messages(prompt)
            return lambda: self.chat_tokens(messages)
        ids = checks.token_ids(
            prompt, vocab_size=vocab_size(self), name="prompt token ids", allow_empty=False
        )
        return lambda: ids

    def chat_tokens(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """The prompt's token ids for ``messages``: the model's chat template rendered
        (bounded in time and size) and tokenized, where the control tokens the template
        writes are control tokens, and text inside the messages never is (a user cannot
        forge ``<|im_start|>system``). Needs no turn: safe to call from a worker thread
        while the session generates."""
        checked = checks.messages(messages)
        protected = protect_messages(checked, self._control_texts())
        if not protected.forged:
            return self.tokenize(self.render_chat(checked))
        ids: list[int] = []
        for i, (text, forged) in enumerate(protected.pieces(self.render_chat(protected.messages))):
            if forged:
                ids += self._text_tokens(text)
            elif text or i == 0:
                ids += self.tokenize(text, add_special=i == 0)
        return ids

    def stream(
        self, prompt: str, sampling: Sampling | None = None, **overrides: Any
    ) -> GenerationHandle:
        """Stream a completion of ``prompt`` (a handle: iterate it, or close it)."""
        return self.start(checks.prompt(prompt), sampling, **overrides)

    def stream_from_tokens(
        self, prompt_tokens: Sequence[int], sampling: Sampling | None = None, **overrides: Any
    ) -> GenerationHandle:
        """Stream a completion of prompt token ids (from ``tokenize`` or ``chat_tokens``)."""
        ids = checks.token_ids(
            prompt_tokens, vocab_size=vocab_size(self), name="prompt token ids", allow_empty=False
        )
        return self.start(ids, sampling, **overrides)

    def generate(
        self, prompt: str, sampling: Sampling | None = None, **overrides: Any
    ) -> Generation:
        return self.stream(prompt, sampling, **overrides).result()

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        sampling: Sampling | None = None,
        **overrides: Any,
    ) -> Generation:
        return self.chat_stream(messages, sampling, **overrides).result()

    def chat_stream(
        self,
        messages: Sequence[Mapping[str, Any]],
        sampling: Sampling | None = None,
        **overrides: Any,
    ) -> GenerationHandle:
        return self.start(checks.messages(messages), sampling, **overrides)

    def clear_cache(self) -> None:
        """Forget cached prompt state, so the next prompt is evaluated from scratch
        (runtimes that reuse a shared prompt prefix override this; benchmarks call it). A
        batched session also drops the prefixes its finished requests left (the running
        ones keep theirs); a runtime that cannot drop them raises GenerationError.
        (An override runs wrapped, and the wrapper drops the batch's prefixes after it.)"""
        if self._batch is not None:
            self._batch.forget_prefixes()

    def close(self) -> None:
        """Free the model's memory. Idempotent. Every generation not finished is closed
        first, whichever thread reads it (it yields nothing more; one inside a token stops
        after it), and queued ones never start: close never waits on a stream that its
        reader left half-read, which would be forever."""
        readers: Any = contextlib.nullcontext()
        if self._batch is not None:  # its generations end cancelled, its runtime is freed
            with backend_errors(target_of(self), "closing the batch"):
                self._batch.close()
            readers = self._batch.readers  # no batched reader is inside the tokenizer now
        for generation in self._scheduler.generations():
            generation.close()
        with self._scheduler.turn(), readers, backend_errors(target_of(self), "closing"):
            self._ended = True
            self._close()
