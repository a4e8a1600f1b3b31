"""The boundary between a Session's callers and its runtime: every argument checked on the
way in, every backend exception mapped on the way out, in this module only.

The runtimes trust their arguments (a token id of -1 aborts llama.cpp), so a Session
subclass's runtime methods (``tokenize``, ``detokenize``, ``stream_tokens``,
``render_chat``, ``logits``, ``clear_cache``) are wrapped when the class is defined
(``wrap_runtime_methods``): whoever calls them (generate(), the server, bench, a script)
gets the input checked and any backend exception translated.

Backend exceptions become edgekit errors in ``backend_errors``, one table for every
target, as httpx's ``map_httpcore_exceptions`` does for its transport: llama.cpp's
RuntimeErrors, OpenVINO's, a MemoryError. Edgekit errors pass through unchanged. The
targets use the same context manager around loading; nothing else in them re-maps.

The calls that need the runtime to themselves (``logits``, ``clear_cache``) take their
turn in the session's scheduler here; a ``stream_tokens`` called from outside a
generation becomes a generation of its own (``Session.start``), so it queues like one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from edgekit.targets import checks
from edgekit.targets.values import Sampling, StreamChunk

from edgekit.errors import EdgekitError, GenerationError, SettingError

if TYPE_CHECKING:
    from edgekit.targets.session import Session

RUNTIME_HINT = "run with -v to see the runtime's log; if it repeats, load the model again"
MEMORY_HINT = (
    "the runtime ran out of memory: load with a smaller context, close other programs, or "
    "use a smaller variant"
)

# Backend exception -> (the edgekit error it becomes, its hint); the first row that matches.
MAPPED: tuple[tuple[type[BaseException], type[EdgekitError], str], ...] = (
    (MemoryError, GenerationError, MEMORY_HINT),
    (Exception, GenerationError, RUNTIME_HINT),
)


@contextmanager
def backend_errors(target: str, what: str, *, hint: str | None = None) -> Iterator[None]:
    """Map any backend exception raised inside into its edgekit error (``MAPPED``), naming
    ``target`` and ``what`` it was doing; the backend's exception is the cause."""
    try:
        yield
    except EdgekitError:
        raise
    except Exception as exc:  # noqa: BLE001 - every backend failure is mapped, here only
        error, default = next((e, h) for kind, e, h in MAPPED if isinstance(exc, kind))
        raise error(
            f"{target} failed during {what}: {type(exc).__name__}: {exc}", hint=hint or default
        ) from exc


def target_of(session: Session) -> str:
    return getattr(getattr(session, "info", None), "target", "the runtime")


def vocab_size(session: Session) -> int | None:
    info = getattr(session, "info", None)
    return info.vocab_size if info is not None else None


def close_iterator(chunks: Iterator[StreamChunk]) -> None:
    close = getattr(chunks, "close", None)
    if close is not None:
        close()


def translated(session: Session, chunks: Iterator[StreamChunk]) -> Iterator[StreamChunk]:
    """``chunks`` with every backend exception mapped, also those raised on closing."""
    target = target_of(session)
    try:
        while True:
            with backend_errors(target, "generation"):
                try:
                    chunk = next(chunks)
                except StopIteration:
                    return
            yield chunk
    finally:
        with backend_errors(target, "generation"):
            close_iterator(chunks)


# --- the wrappers around each runtime method -------------------------------------------------


def _check_tokenize(impl: Callable[..., list[int]]) -> Callable[..., list[int]]:
    @functools.wraps(impl)
    def tokenize(self: Session, text: str, *, add_special: bool = True) -> list[int]:
        checks.text("text", text)
        checks.flag("add_special", add_special)
        with backend_errors(target_of(self), "tokenization"):
            return impl(self, text, add_special=add_special)

    return tokenize


def _check_detokenize(impl: Callable[..., str]) -> Callable[..., str]:
    @functools.wraps(impl)
    def detokenize(self: Session, tokens: Sequence[int]) -> str:
        ids = checks.token_ids(tokens, vocab_size=vocab_size(self))
        with backend_errors(target_of(self), "detokenization"):
            return impl(self, ids)

    return detokenize


def _check_stream_tokens(
    impl: Callable[..., Iterator[StreamChunk]],
) -> Callable[..., Iterator[StreamChunk]]:
    @functools.wraps(impl)
    def stream_tokens(
        self: Session, prompt_tokens: Sequence[int], sampling: Sampling
    ) -> Iterator[StreamChunk]:
        ids = checks.token_ids(
            prompt_tokens, vocab_size=vocab_size(self), name="prompt token ids", allow_empty=False
        )
        if not isinstance(sampling, Sampling):
            raise SettingError(
                f"sampling must be a Sampling, not {type(sampling).__name__}",
                hint="pass Sampling(max_tokens=..., temperature=...)",
            )
        if not self._scheduler.in_step_here():
            # Called from outside a generation (a benchmark, a script): it becomes a
            # generation of its own, and waits its turn like any other.
            return self.start(ids, sampling)
        with backend_errors(target_of(self), "generation"):
            chunks = impl(self, ids, sampling)
        return translated(self, chunks)

    return stream_tokens


def _check_render_chat(impl: Callable[..., str]) -> Callable[..., str]:
    @functools.wraps(impl)
    def render_chat(self: Session, messages: Sequence[Mapping[str, Any]]) -> str:
        checked = checks.messages(messages)
        with backend_errors(target_of(self), "the chat template"):
            return impl(self, checked)

    return render_chat


def _check_logits(impl: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(impl)
    def logits(self: Session, tokens: Sequence[int]) -> Any:
        ids = checks.token_ids(tokens, vocab_size=vocab_size(self), allow_empty=False)
        info = getattr(self, "info", None)
        if info is not None and len(ids) > info.context_length:
            raise SettingError(
                f"{len(ids)} tokens do not fit the context of {info.context_length}",
                hint="evaluate shorter windows, or load with a larger context",
            )
        with self._scheduler.turn(), backend_errors(target_of(self), "evaluation"):
            return impl(self, ids)

    return logits


def _check_clear_cache(impl: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(impl)
    def clear_cache(self: Session) -> None:
        with self._scheduler.turn(), backend_errors(target_of(self), "clearing the cache"):
            impl(self)
        if self._batch is not None:  # and the prefixes the batch keeps, between two steps
            self._batch.forget_prefixes()

    return clear_cache


CHECKERS: dict[str, Callable[[Any], Any]] = {
    "tokenize": _check_tokenize,
    "detokenize": _check_detokenize,
    "stream_tokens": _check_stream_tokens,
    "render_chat": _check_render_chat,
    "logits": _check_logits,
    "clear_cache": _check_clear_cache,
}


def wrap_runtime_methods(cls: type[Session]) -> None:
    """Wrap every runtime method ``cls`` defines itself (once: a subclass of a subclass
    wraps only what it overrides)."""
    for name, checker in CHECKERS.items():
        impl = cls.__dict__.get(name)
        if impl is not None and not getattr(impl, "_edgekit_checked", False):
            wrapped = checker(impl)
            wrapped._edgekit_checked = True
            setattr(cls, name, wrapped)
