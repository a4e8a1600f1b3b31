"""The Target and Session interfaces every runtime implements, and their value types.

A Target is a runtime family (llama.cpp, OpenVINO, ...): capability class attributes
say what it loads, and ``load`` returns a Session. A Session is one loaded model:
generate, stream, chat, tokenize, logits, close. Every Session serializes concurrent
calls with a lock, so one Session shared between threads never interleaves two
generations.

Errors: ``load`` raises TargetUnavailableError (SDK missing), ModelFormatError (the file
is not a model this target loads) or GenerationError (the runtime refused it); generation
methods raise GenerationError.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from edgekit.targets.catalog import TargetInfo

if TYPE_CHECKING:
    import numpy as np

FinishReason = Literal["stop", "length", "cancelled"]


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """How to pick tokens. ``temperature == 0`` is greedy decoding."""

    max_tokens: int = 256
    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False  # generate max_tokens even past end-of-sequence (benchmarks)


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


class Session(ABC):
    """One loaded model. Use as a context manager, or call ``close``.

    ``bundle`` and ``variant`` are set when the session came from ``edgekit.load``.
    """

    info: SessionInfo
    bundle: Any = None
    variant: Any = None

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._cancel = threading.Event()

    def cancel(self) -> None:
        """Stop the generation in progress (from any thread) at its next token."""
        self._cancel.set()

    def _start(self) -> None:
        # A cancel aimed at an earlier generation must not stop the next one.
        self._cancel.clear()

    @abstractmethod
    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special`` adds BOS where the model wants it."""

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

    # --- the public generation API, the same on every target ---------------------------

    def stream(
        self, prompt: str, sampling: Sampling | None = None, **overrides: Any
    ) -> Iterator[StreamChunk]:
        """Stream a completion of ``prompt``. Holds the session's lock while it runs."""
        sampling = _sampling(sampling, overrides)
        with self._lock:
            self._start()
            yield from self.stream_tokens(self.tokenize(prompt), sampling)

    def generate(
        self, prompt: str, sampling: Sampling | None = None, **overrides: Any
    ) -> Generation:
        sampling = _sampling(sampling, overrides)
        with self._lock:
            self._start()
            tokens = self.tokenize(prompt)
            return _collect(self.stream_tokens(tokens, sampling), len(tokens))

    def chat(
        self, messages: Sequence[dict[str, str]], sampling: Sampling | None = None, **overrides: Any
    ) -> Generation:
        sampling = _sampling(sampling, overrides)
        with self._lock:
            self._start()
            tokens = self.tokenize(self.render_chat(messages), add_special=True)
            return _collect(self.stream_tokens(tokens, sampling), len(tokens))

    def chat_stream(
        self, messages: Sequence[dict[str, str]], sampling: Sampling | None = None, **overrides: Any
    ) -> Iterator[StreamChunk]:
        sampling = _sampling(sampling, overrides)
        with self._lock:
            self._start()
            tokens = self.tokenize(self.render_chat(messages), add_special=True)
            yield from self.stream_tokens(tokens, sampling)

    def clear_cache(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Forget cached prompt state, so the next prompt is evaluated from scratch
        (runtimes that reuse a shared prompt prefix override this; benchmarks call it)."""

    def close(self) -> None:
        """Free the model's memory. Idempotent."""
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


class Target(ABC):
    """A runtime family. ``info`` is its row of the target catalogue (name, formats,
    quantizations, SDK, install hint), readable without loading any SDK."""

    info: ClassVar[TargetInfo]

    @classmethod
    @abstractmethod
    def load(cls, model: str | Path, **settings: Any) -> Session:
        """Load ``model`` with runtime ``settings`` (context, threads, KV-cache type, ...)."""


def _sampling(base: Sampling | None, overrides: dict[str, Any]) -> Sampling:
    from dataclasses import replace

    s = base or Sampling()
    if "stop" in overrides and isinstance(overrides["stop"], str | list):
        stop = overrides["stop"]
        overrides = {**overrides, "stop": (stop,) if isinstance(stop, str) else tuple(stop)}
    return replace(s, **overrides) if overrides else s


def _collect(chunks: Iterator[StreamChunk], prompt_tokens: int) -> Generation:
    text: list[str] = []
    count = 0
    reason: FinishReason = "length"
    for chunk in chunks:
        text.append(chunk.text)
        count += chunk.tokens
        if chunk.finish_reason:
            reason = chunk.finish_reason
    return Generation(
        text="".join(text),
        prompt_tokens=prompt_tokens,
        completion_tokens=count,
        finish_reason=reason,
    )
