"""The x86 (and any-CPU) GGUF target: llama.cpp through llama-cpp-python.

Settings come from the call, else from the model (the KV-cache type edgekit recorded in
the GGUF's ``edgekit.recipe``), else from defaults: threads = physical cores, context =
min(model context, 4096), batch min(512, context), mmap on, no GPU layers. Every setting is
checked first (targets/checks.py): llama.cpp aborts the process on a thread count of
100000 and hangs on a context of 10**9.

Sliding-window models (Gemma 3) run with llama.cpp's windowed KV cache (``swa_full`` off):
the sliding-window layers keep only the last window of positions (at context 32768 a
Gemma 3 270M holds 111 MiB of KV instead of 576 MiB). Such a cache can no longer resume
a prompt from a point before that window, so prompt-prefix reuse starts afresh then.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import psutil
from edgekit.targets import checks
from edgekit.targets.base import Sampling, Session, SessionInfo, StreamChunk, Target
from edgekit.targets.catalog import BY_NAME, TargetInfo
from edgekit.targets.llamacpp_log import route_llamacpp_logs
from edgekit.targets.text import (
    NO_TEMPLATE_HINT,
    StopMatcher,
    Utf8Stream,
    render_chat_template,
)

from edgekit.errors import GenerationError, TargetUnavailableError
from edgekit.gguf_header import GGUFHeader, read_gguf_header

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

# KV-cache type name -> ggml type id
KV_TYPES = {
    "f32": 0,
    "f16": 1,
    "q4_0": 2,
    "q4_1": 3,
    "q5_0": 6,
    "q5_1": 7,
    "q8_0": 8,
    "iq4_nl": 20,
    "bf16": 30,
}
DEFAULT_CONTEXT = 4096
DEFAULT_BATCH = 512
SETTINGS = (
    "context",
    "threads",
    "batch",
    "kv_cache",
    "mmap",
    "mlock",
    "gpu_layers",
    "seed",
    "logits",
)


class LlamaCppTarget(Target):
    info: ClassVar[TargetInfo] = BY_NAME["llamacpp"]

    @classmethod
    def load(cls, model: str | Path, **settings: Any) -> LlamaCppSession:
        """Load a GGUF file.

        Settings: ``context`` (tokens), ``threads``, ``batch``, ``kv_cache`` (f16, q8_0, ...),
        ``mmap``, ``mlock``, ``gpu_layers`` (-1: all, when the build has a GPU backend),
        ``seed``, ``logits`` (keep logits of every position; needed by ``logits()``).

        Raises:
            TargetUnavailableError: llama-cpp-python is not installed.
            ModelFormatError: not a readable GGUF file.
            SettingError: an unknown setting, or one of the wrong type or out of range.
            GenerationError: llama.cpp refused the file.
        """
        checks.known_settings(settings, SETTINGS, what="llama.cpp setting")
        return LlamaCppSession(Path(model), settings)


@dataclass(frozen=True, kw_only=True)
class _Settings:
    context: int
    threads: int
    batch: int
    kv_cache: str
    mmap: bool
    mlock: bool
    gpu_layers: int
    seed: int | None
    logits: bool


def _settings(given: dict[str, Any], header: GGUFHeader) -> _Settings:
    """The checked settings: each given one in its valid range, the rest defaulted.

    Raises:
        SettingError: a setting of the wrong type or out of range, naming the range.
    """

    given = {k: v for k, v in given.items() if v is not None}  # None means the default
    get = given.get

    arch = header.get("general.architecture")
    trained = header.get(f"{arch}.context_length")
    model_ctx = trained if isinstance(trained, int) and trained > 0 else DEFAULT_CONTEXT
    context = (
        min(model_ctx, DEFAULT_CONTEXT)
        if get("context") is None
        else checks.integer(
            "context", get("context"), low=1, high=model_ctx, note="the model's context length"
        )
    )
    recorded = header.get("edgekit.recipe")
    try:
        recipe = json.loads(recorded) if isinstance(recorded, str) else {}
    except json.JSONDecodeError:
        recipe = {}
    kv = get("kv_cache")
    if kv is None and isinstance(recipe, dict):
        kv = recipe.get("kv_cache")
    return _Settings(
        context=context,
        threads=psutil.cpu_count(logical=False) or 1
        if get("threads") is None
        else checks.integer("threads", get("threads"), low=1, high=checks.max_threads()),
        batch=min(DEFAULT_BATCH, context)
        if get("batch") is None
        else checks.integer("batch", get("batch"), low=1, high=context, note="up to the context"),
        kv_cache=checks.choice("kv_cache", "f16" if kv is None else kv, tuple(KV_TYPES)),
        mmap=checks.flag("mmap", given.get("mmap", True)),
        mlock=checks.flag("mlock", given.get("mlock", False)),
        gpu_layers=checks.integer(
            "gpu_layers", given.get("gpu_layers", 0), low=-1, note="-1: all layers"
        ),
        seed=None
        if get("seed") is None
        else checks.integer("seed", get("seed"), low=0, high=checks.MAX_SEED),
        logits=checks.flag("logits", given.get("logits", False)),
    )


class LlamaCppSession(Session):
    def __init__(self, path: Path, given: dict[str, Any]) -> None:
        super().__init__()
        try:
            import llama_cpp
        except ImportError as exc:
            raise TargetUnavailableError(
                "llama-cpp-python is not installed", hint="pip install 'edgekit[gguf]'"
            ) from exc
        header = read_gguf_header(path)  # raises ModelFormatError with the reason
        settings = _settings(given, header)
        if settings.gpu_layers and not llama_cpp.llama_supports_gpu_offload():
            raise GenerationError(
                "gpu_layers was asked for, but this llama.cpp build has no GPU backend",
                hint="rebuild llama-cpp-python with CUDA, Metal or Vulkan, or use gpu_layers=0",
            )
        kv = settings.kv_cache
        route_llamacpp_logs()
        try:
            self._llm = llama_cpp.Llama(
                model_path=str(path),
                n_ctx=settings.context,
                n_threads=settings.threads,
                n_threads_batch=settings.threads,
                n_batch=settings.batch,
                type_k=KV_TYPES[kv],
                type_v=KV_TYPES[kv],
                # llama.cpp stores a quantized V cache only with flash attention.
                flash_attn=kv not in ("f16", "f32", "bf16"),
                use_mmap=settings.mmap,
                use_mlock=settings.mlock,
                n_gpu_layers=settings.gpu_layers,
                # Sliding-window layers keep their window only, not the whole context.
                swa_full=False,
                seed=llama_cpp.LLAMA_DEFAULT_SEED if settings.seed is None else settings.seed,
                logits_all=settings.logits,
                verbose=False,
            )
        except (ValueError, RuntimeError, MemoryError) as exc:
            raise GenerationError(
                f"llama.cpp could not load {path}: {exc}", hint="run with -v to see llama.cpp's log"
            ) from exc
        self._llama_cpp = llama_cpp
        # No seed asked for: llama.cpp's "random" seed, drawn afresh for every generation.
        self._load_seed = llama_cpp.LLAMA_DEFAULT_SEED if settings.seed is None else settings.seed
        # llama.cpp's own answer: a GGUF from another tool may lack add_bos_token, and
        # llama.cpp then adds BOS by its vocabulary type (SentencePiece, llama-bpe).
        self._add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self._llm._model.vocab))
        self._template = header.get("tokenizer.chat_template")
        self._keep_logits = settings.logits
        self._n_swa = int(llama_cpp.llama_model_n_swa(self._llm.model))
        self._controls: tuple[str, ...] | None = None
        vocab = self._llm._model.vocab
        self.info = SessionInfo(
            target=LlamaCppTarget.info.name,
            model_path=str(path),
            context_length=settings.context,
            threads=settings.threads,
            kv_cache=kv,
            settings={
                "batch": settings.batch,
                "mmap": settings.mmap,
                "mlock": settings.mlock,
                "gpu_layers": settings.gpu_layers,
                **({"sliding_window": self._n_swa, "swa_full": False} if self._n_swa else {}),
            },
            vocab_size=int(llama_cpp.llama_vocab_n_tokens(vocab)),
        )
        self._closed = False

    # --- tokens -------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        self._check_open()
        return list(
            self._llm.tokenize(
                text.encode("utf-8"), add_bos=add_special and self._add_bos, special=True
            )
        )

    def detokenize(self, tokens: Sequence[int]) -> str:
        self._check_open()
        return self._llm.detokenize(list(tokens)).decode("utf-8", errors="replace")

    def _text_tokens(self, text: str) -> list[int]:
        """``text`` as plain text: llama.cpp's own switch leaves control tokens unparsed."""
        self._check_open()
        return list(self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    def _control_texts(self) -> tuple[str, ...]:
        """The text of every token llama.cpp marks as a control token (read once)."""
        if self._controls is None:
            self._check_open()
            lib, vocab = self._llama_cpp, self._llm._model.vocab
            control = lib.LLAMA_TOKEN_ATTR_CONTROL
            self._controls = tuple(
                text
                for token in range(lib.llama_vocab_n_tokens(vocab))
                if lib.llama_vocab_get_attr(vocab, token) & control
                and (text := self._token_text(token))
            )
        return self._controls

    def _token_text(self, token: int) -> str:
        vocab = self._llm._model.vocab
        size = self._llama_cpp.llama_vocab_n_tokens(vocab)
        if not 0 <= token < size:
            return ""
        text: bytes = self._llama_cpp.llama_vocab_get_text(vocab, token)
        return text.decode("utf-8", errors="replace")

    # --- generation ---------------------------------------------------------------------

    def stream_tokens(
        self, prompt_tokens: Sequence[int], sampling: Sampling
    ) -> Iterator[StreamChunk]:
        self._check_open()
        llm = self._llm
        # llama.cpp may round its context up; llama-cpp-python's buffers keep the size asked.
        n_ctx = min(llm.n_ctx(), len(llm.input_ids))
        if len(prompt_tokens) >= n_ctx:
            raise GenerationError(
                f"the prompt has {len(prompt_tokens)} tokens; the context holds {n_ctx}",
                hint="shorten the prompt or load with a larger context",
            )
        # The seed is set for every call, so one call's seed never carries into the next.
        llm.set_seed(self._load_seed if sampling.seed is None else sampling.seed)
        self._forget_unreachable_prefix(prompt_tokens)
        budget = min(sampling.max_tokens, n_ctx - len(prompt_tokens))
        if budget <= 0:
            return
        stops = StopMatcher(sampling.stop)
        utf8 = Utf8Stream()
        vocab = llm._model.vocab
        generator = llm.generate(
            list(prompt_tokens),
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            min_p=sampling.min_p,
            temp=sampling.temperature,
            repeat_penalty=sampling.repeat_penalty,
        )
        count = 0
        try:
            for token in generator:
                if self._cancel.is_set():
                    yield StreamChunk(
                        text=stops.flush() + utf8.flush(), tokens=0, finish_reason="cancelled"
                    )
                    return
                if not sampling.ignore_eos and self._llama_cpp.llama_vocab_is_eog(vocab, token):
                    yield StreamChunk(
                        text=stops.flush() + utf8.flush(), tokens=0, finish_reason="stop"
                    )
                    return
                count += 1
                piece = llm.detokenize([token], prev_tokens=None)
                text, stopped = stops.feed(utf8.feed(piece))
                if stopped:
                    yield StreamChunk(text=text, tokens=1, finish_reason="stop")
                    return
                if count >= budget:
                    tail = stops.feed(utf8.flush())[0] + stops.flush()
                    yield StreamChunk(text=text + tail, tokens=1, finish_reason="length")
                    return
                yield StreamChunk(text=text, tokens=1)
        finally:
            generator.close()

    def _forget_unreachable_prefix(self, prompt_tokens: Sequence[int]) -> None:
        """Start afresh when llama-cpp-python would resume from a cached prefix that the
        windowed cache no longer holds. It reuses the longest common prefix of the last
        prompt and this one and decodes the rest from there; but the sliding-window layers
        keep only the last ``n_swa`` positions, so resuming at position p needs positions
        p - n_swa .. p - 1 still cached (the rule llama.cpp's own server applies), or the
        logits are silently wrong."""
        llm = self._llm
        if not self._n_swa or llm.n_tokens == 0:
            return
        prefix = 0
        for cached, new in zip(llm._input_ids.tolist(), prompt_tokens, strict=False):
            if cached != new:
                break
            prefix += 1
        if prefix == llm.n_tokens == len(prompt_tokens) and not llm._requires_eval:
            return  # the whole prompt is cached: llama-cpp-python decodes nothing old
        resume = prefix - 1 if prefix == len(prompt_tokens) else prefix
        if resume <= 0:
            return
        memory = self._llama_cpp.llama_get_memory(llm.ctx)
        oldest = self._llama_cpp.llama_memory_seq_pos_min(memory, 0)
        if oldest > max(0, resume - self._n_swa):
            llm.reset()  # type: ignore[no-untyped-call]

    def render_chat(self, messages: Sequence[dict[str, str]]) -> str:
        self._check_open()
        if not isinstance(self._template, str):
            raise GenerationError(
                f"{self.info.model_path} has no chat template", hint=NO_TEMPLATE_HINT
            )
        llm = self._llm
        bos = self._token_text(llm.token_bos())
        text = render_chat_template(
            self._template, messages, bos_token=bos, eos_token=self._token_text(llm.token_eos())
        )
        # The template may write BOS itself; tokenize() adds it when the model asks.
        if self._add_bos and bos and text.startswith(bos):
            text = text[len(bos) :]
        return text

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        import numpy as np

        self._check_open()
        if not self._keep_logits:
            raise GenerationError(
                "logits of every position were not kept", hint="load with logits=True"
            )
        with self._lock:
            self._llm.reset()  # type: ignore[no-untyped-call]
            self._llm.eval(list(tokens))
            return np.array(self._llm.scores[: len(tokens)], dtype=np.float32)

    def clear_cache(self) -> None:
        with self._lock:
            self._check_open()
            self._llm.reset()  # type: ignore[no-untyped-call]

    # --- lifetime -------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise GenerationError("the session is closed", hint="load the model again")

    def _close(self) -> None:
        if not self._closed:
            self._llm.close()
            self._closed = True
