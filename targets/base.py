"""The Target and Session interfaces every runtime implements, and their value types.

A Target is a runtime family (llama.cpp, OpenVINO, ...): capability class attributes
say what it loads, and ``load`` returns a Session. A Session is one loaded model:
generate, stream, chat, tokenize, logits, close.

The runtimes trust their arguments (a token id of -1 aborts llama.cpp), so nothing reaches
them unchecked: ``Sampling`` checks its fields when it is made, the targets check their
load settings (targets/checks.py), and a Session subclass's runtime methods (``tokenize``,
``detokenize``, ``stream_tokens``, ``render_chat``, ``logits``) are wrapped when the class
is defined, so that whoever calls them (generate(), the server, bench) gets their input
checked and any backend exception translated into a GenerationError.

One call at a time: a Session runs one generation at a time. Other threads wait their
turn; the thread that holds the session (a stream() it has not finished) is refused
with a GenerationError, where a re-entrant lock would run the second call inside the
first and corrupt it. Closing a stream, or dropping it, releases the session.

Errors: ``load`` raises SettingError (a setting of the wrong type or out of range),
TargetUnavailableError (SDK missing), ModelFormatError (the file is not a model this
target loads) or GenerationError (the runtime refused it); calls raise SettingError for
bad arguments and GenerationError for everything the runtime does wrong.
"""

from __future__ import annotations

import functools
import threading
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from edgekit.targets import checks
from edgekit.targets.catalog import TargetInfo
from edgekit.targets.text import protect_messages, split_control_text

from edgekit.errors import EdgekitError, GenerationError, SettingError

if TYPE_CHECKING:
    import numpy as np

FinishReason = Literal["stop", "length", "cancelled"]


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """How to pick tokens. ``temperature == 0`` is greedy decoding; ``top_k == 0`` turns
    top-k off; ``seed`` (0 to 2**32 - 2) makes sampling repeatable for this call only.

    Every field is checked here (SettingError with the valid range), so a Sampling that
    exists is one every runtime can take."""

    max_tokens: int = 256
    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False  # generate max_tokens even past end-of-sequence (benchmarks)

    def __post_init__(self) -> None:
        checked: dict[str, Any] = {
            "max_tokens": checks.integer("max_tokens", self.max_tokens, low=1),
            "temperature": checks.number(
                "temperature", self.temperature, low=0.0, high=checks.MAX_TEMPERATURE
            ),
            "top_p": checks.number("top_p", self.top_p, low=0.0, high=1.0, low_open=True),
            "top_k": checks.integer("top_k", self.top_k, low=0, note="0: off"),
            "min_p": checks.number("min_p", self.min_p, low=0.0, high=1.0),
            "repeat_penalty": checks.number(
                "repeat_penalty",
                self.repeat_penalty,
                low=0.0,
                high=checks.MAX_REPEAT_PENALTY,
                low_open=True,
            ),
            "seed": None
            if self.seed is None
            else checks.integer("seed", self.seed, low=0, high=checks.MAX_SEED),
            "stop": checks.stop_strings(self.stop),
            "ignore_eos": checks.flag("ignore_eos", self.ignore_eos),
        }
        for name, value in checked.items():  # the canonical types: int, float, tuple
            object.__setattr__(self, name, value)


SAMPLING_FIELDS = tuple(f.name for f in fields(Sampling))


@dataclass(frozen=True, kw_only=True)
class StreamChunk:
    """A piece of generated text and how many tokens produced it."""

    text: str
    tokens: int
    finish_reason: FinishReason | None = None


@dataclass(frozen=True, kw_only=True)
class Generation:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: FinishReason


@dataclass(frozen=True, kw_only=True)
class SessionInfo:
    target: str
    model_path: str
    context_length: int
    threads: int
    kv_cache: str
    settings: dict[str, Any] = field(default_factory=dict)
    vocab_size: int | None = None  # token ids are 0 to vocab_size - 1 (None: not known)


class _SessionLock:
    """One call at a time. Unlike an RLock it refuses, instead of letting through, a second
    call from the thread that holds it: that call would run inside the first one (a
    stream() read half-way) and corrupt it. Other threads wait their turn."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None

    def acquire(self) -> None:
        if self._owner == threading.get_ident():
            raise GenerationError(
                "this session is busy: a stream (stream() or chat_stream()) on this thread "
                "is not finished",
                hint="read the stream to its end or call its close() before the next call on "
                "this session (a call from another thread would wait its turn)",
            )
        self._lock.acquire()
        self._owner = threading.get_ident()

    def claim(self) -> None:
        """The thread resuming a held stream holds the session from now on."""
        self._owner = threading.get_ident()

    def release(self) -> None:
        self._owner = None
        self._lock.release()

    def held_here(self) -> bool:
        return self._owner == threading.get_ident()

    def __enter__(self) -> _SessionLock:
        self.acquire()
        return self

    def __exit__(self, *_: object) -> None:
        self.release()


_RUNTIME_METHODS = ("tokenize", "detokenize", "stream_tokens", "render_chat", "logits")


class Session(ABC):
    """One loaded model. Use as a context manager, or call ``close``.

    ``bundle`` and ``variant`` are set when the session came from ``edgekit.load``.
    """

    info: SessionInfo
    bundle: Any = None
    variant: Any = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Every runtime method a subclass defines gets its input checked and its backend
        # exceptions translated, however it is reached.
        for name in _RUNTIME_METHODS:
            impl = cls.__dict__.get(name)
            if impl is not None and not getattr(impl, "_edgekit_checked", False):
                wrapped = _CHECKERS[name](impl)
                wrapped._edgekit_checked = True
                setattr(cls, name, wrapped)

    def __init__(self) -> None:
        self._lock = _SessionLock()
        self._cancel = threading.Event()
        self._stream: weakref.ref[Generator[StreamChunk, None, None]] | None = None

    def cancel(self) -> None:
        """Stop the generation in progress (from any thread) at its next token."""
        self._cancel.set()

    def _start(self) -> None:
        # A cancel aimed at an earlier generation must not stop the next one.
        self._cancel.clear()

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
        """Generate from token ids, yielding text as it becomes complete UTF-8."""

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

    def chat_tokens(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """The prompt's token ids for ``messages``: the model's chat template rendered
        (bounded in time and size) and tokenized, where the control tokens the template
        writes are control tokens, and text inside the messages never is (a user cannot
        forge ``<|im_start|>system``). Needs no lock: safe to call from a worker thread
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
    ) -> Iterator[StreamChunk]:
        """Stream a completion of ``prompt``. Arguments are checked now; the session is
        held from the first chunk until the stream ends, is closed or is dropped."""
        params = _sampling(sampling, overrides)
        text = checks.prompt(prompt)
        return self._held_stream(lambda: self.stream_tokens(self.tokenize(text), params))

    def stream_from_tokens(
        self, prompt_tokens: Sequence[int], sampling: Sampling | None = None, **overrides: Any
    ) -> Iterator[StreamChunk]:
        """Stream a completion of prompt token ids (from ``tokenize`` or ``chat_tokens``),
        holding the session like ``stream``: what the server runs on its worker threads."""
        params = _sampling(sampling, overrides)
        ids = checks.token_ids(
            prompt_tokens, vocab_size=_vocab(self), name="prompt token ids", allow_empty=False
        )
        return self._held_stream(lambda: self.stream_tokens(ids, params))

    def generate(
        self, prompt: str, sampling: Sampling | None = None, **overrides: Any
    ) -> Generation:
        params = _sampling(sampling, overrides)
        text = checks.prompt(prompt)
        with self._hold():
            tokens = self.tokenize(text)
            return _collect(self.stream_tokens(tokens, params), len(tokens))

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        sampling: Sampling | None = None,
        **overrides: Any,
    ) -> Generation:
        params = _sampling(sampling, overrides)
        checked = checks.messages(messages)
        with self._hold():
            tokens = self.chat_tokens(checked)
            return _collect(self.stream_tokens(tokens, params), len(tokens))

    def chat_stream(
        self,
        messages: Sequence[Mapping[str, Any]],
        sampling: Sampling | None = None,
        **overrides: Any,
    ) -> Iterator[StreamChunk]:
        params = _sampling(sampling, overrides)
        checked = checks.messages(messages)
        return self._held_stream(lambda: self.stream_tokens(self.chat_tokens(checked), params))

    def clear_cache(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Forget cached prompt state, so the next prompt is evaluated from scratch
        (runtimes that reuse a shared prompt prefix override this; benchmarks call it)."""

    def close(self) -> None:
        """Free the model's memory. Idempotent. A stream this thread has not finished is
        closed first (it yields nothing more)."""
        if self._lock.held_here() and self._stream is not None:
            stream = self._stream()
            if stream is not None:
                stream.close()
        with self._lock:
            self._close()

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- holding the session ---------------------------------------------------------------

    @contextmanager
    def _hold(
        self, stream: weakref.ref[Generator[StreamChunk, None, None]] | None = None
    ) -> Iterator[None]:
        self._lock.acquire()
        try:
            self._stream = stream
            self._start()
            yield
        finally:
            self._stream = None
            self._lock.release()

    def _held_stream(
        self, start: Callable[[], Iterator[StreamChunk]]
    ) -> Generator[StreamChunk, None, None]:
        me: list[weakref.ref[Generator[StreamChunk, None, None]]] = []

        def run() -> Generator[StreamChunk, None, None]:
            with self._hold(me[0]):
                chunks = start()
                try:
                    for chunk in chunks:
                        yield chunk
                        self._lock.claim()  # resumed, perhaps on another thread
                finally:
                    _close_iterator(chunks)

        gen = run()
        me.append(weakref.ref(gen))  # weak: a dropped stream is freed, and frees the session
        return gen


class Target(ABC):
    """A runtime family. ``info`` is its row of the target catalogue (name, formats,
    quantizations, SDK, install hint), readable without loading any SDK."""

    info: ClassVar[TargetInfo]

    @classmethod
    @abstractmethod
    def load(cls, model: str | Path, **settings: Any) -> Session:
        """Load ``model`` with runtime ``settings`` (context, threads, KV-cache type, ...).

        Raises:
            SettingError: an unknown setting, or one of the wrong type or out of range.
        """


# --- the checks around each runtime method ---------------------------------------------------


@contextmanager
def _runtime_call(session: Session, what: str) -> Iterator[None]:
    """Backend exceptions (llama.cpp's RuntimeError, OpenVINO's) become GenerationError."""
    try:
        yield
    except EdgekitError:
        raise
    except Exception as exc:
        target = getattr(getattr(session, "info", None), "target", "the runtime")
        raise GenerationError(
            f"{target} failed during {what}: {type(exc).__name__}: {exc}",
            hint="run with -v to see the runtime's log; if it repeats, load the model again",
        ) from exc


def _vocab(session: Session) -> int | None:
    info = getattr(session, "info", None)
    return info.vocab_size if info is not None else None


def _check_tokenize(impl: Callable[..., list[int]]) -> Callable[..., list[int]]:
    @functools.wraps(impl)
    def tokenize(self: Session, text: str, *, add_special: bool = True) -> list[int]:
        checks.text("text", text)
        checks.flag("add_special", add_special)
        with _runtime_call(self, "tokenization"):
            return impl(self, text, add_special=add_special)

    return tokenize


def _check_detokenize(impl: Callable[..., str]) -> Callable[..., str]:
    @functools.wraps(impl)
    def detokenize(self: Session, tokens: Sequence[int]) -> str:
        ids = checks.token_ids(tokens, vocab_size=_vocab(self))
        with _runtime_call(self, "detokenization"):
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
            prompt_tokens, vocab_size=_vocab(self), name="prompt token ids", allow_empty=False
        )
        if not isinstance(sampling, Sampling):
            raise SettingError(
                f"sampling must be a Sampling, not {type(sampling).__name__}",
                hint="pass Sampling(max_tokens=..., temperature=...)",
            )
        return _translated(self, impl(self, ids, sampling))

    return stream_tokens


def _translated(session: Session, chunks: Iterator[StreamChunk]) -> Iterator[StreamChunk]:
    try:
        while True:
            with _runtime_call(session, "generation"):
                try:
                    chunk = next(chunks)
                except StopIteration:
                    return
            yield chunk
    finally:
        with _runtime_call(session, "generation"):
            _close_iterator(chunks)


def _check_render_chat(impl: Callable[..., str]) -> Callable[..., str]:
    @functools.wraps(impl)
    def render_chat(self: Session, messages: Sequence[Mapping[str, Any]]) -> str:
        checked = checks.messages(messages)
        with _runtime_call(self, "the chat template"):
            return impl(self, checked)

    return render_chat


def _check_logits(impl: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(impl)
    def logits(self: Session, tokens: Sequence[int]) -> Any:
        ids = checks.token_ids(tokens, vocab_size=_vocab(self), allow_empty=False)
        info = getattr(self, "info", None)
        if info is not None and len(ids) > info.context_length:
            raise SettingError(
                f"{len(ids)} tokens do not fit the context of {info.context_length}",
                hint="evaluate shorter windows, or load with a larger context",
            )
        with _runtime_call(self, "evaluation"):
            return impl(self, ids)

    return logits


_CHECKERS: dict[str, Callable[[Any], Any]] = {
    "tokenize": _check_tokenize,
    "detokenize": _check_detokenize,
    "stream_tokens": _check_stream_tokens,
    "render_chat": _check_render_chat,
    "logits": _check_logits,
}


def _close_iterator(chunks: Iterator[StreamChunk]) -> None:
    close = getattr(chunks, "close", None)
    if close is not None:
        close()


def _sampling(base: Sampling | None, overrides: dict[str, Any]) -> Sampling:
    if base is not None and not isinstance(base, Sampling):
        raise SettingError(
            f"sampling must be a Sampling (or None), not {type(base).__name__}",
            hint="pass Sampling(...) or keyword arguments such as max_tokens=64",
        )
    checks.known_settings(overrides, SAMPLING_FIELDS, what="sampling parameter")
    s = base or Sampling()
    return replace(s, **overrides) if overrides else s


def _collect(chunks: Iterator[StreamChunk], prompt_tokens: int) -> Generation:
    text: list[str] = []
    count = 0
    reason: FinishReason = "length"
    try:
        for chunk in chunks:
            text.append(chunk.text)
            count += chunk.tokens
            if chunk.finish_reason:
                reason = chunk.finish_reason
    finally:
        _close_iterator(chunks)
    return Generation(
        text="".join(text),
        prompt_tokens=prompt_tokens,
        completion_tokens=count,
        finish_reason=reason,
    )
