"""The x86 (and any-CPU) GGUF target: llama.cpp through llama-cpp-python.

Settings come from the call, else from the model (the KV-cache type edgekit recorded in
the GGUF's ``edgekit.recipe``), else from defaults: threads = physical cores, context =
min(model context, 4096), batch 512, mmap on, no GPU layers.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import psutil
from edgekit.targets.base import Sampling, Session, SessionInfo, StreamChunk, Target
from edgekit.targets.catalog import BY_NAME, TargetInfo
from edgekit.targets.llamacpp_log import route_llamacpp_logs
from edgekit.targets.text import StopMatcher, Utf8Stream, render_chat_template

from edgekit.errors import GenerationError, TargetUnavailableError
from edgekit.gguf_header import read_gguf_header

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
            GenerationError: llama.cpp refused the file or a setting.
        """
        return LlamaCppSession(Path(model), **settings)


class LlamaCppSession(Session):
    def __init__(
        self,
        path: Path,
        *,
        context: int | None = None,
        threads: int | None = None,
        batch: int = 512,
        kv_cache: str | None = None,
        mmap: bool = True,
        mlock: bool = False,
        gpu_layers: int = 0,
        seed: int | None = None,
        logits: bool = False,
    ) -> None:
        super().__init__()
        try:
            import llama_cpp
        except ImportError as exc:
            raise TargetUnavailableError(
                "llama-cpp-python is not installed", hint="pip install 'edgekit[gguf]'"
            ) from exc
        header = read_gguf_header(path)  # raises ModelFormatError with the reason
        arch = header.get("general.architecture")
        recorded = header.get("edgekit.recipe")
        recipe = json.loads(recorded) if isinstance(recorded, str) else {}
        kv = (kv_cache or recipe.get("kv_cache") or "f16").lower()
        if kv not in KV_TYPES:
            raise GenerationError(
                f"unknown KV-cache type {kv!r}", hint=f"use one of {', '.join(KV_TYPES)}"
            )
        model_ctx = int(header.get(f"{arch}.context_length") or DEFAULT_CONTEXT)
        n_ctx = context or min(model_ctx, DEFAULT_CONTEXT)
        n_threads = threads or psutil.cpu_count(logical=False) or 1
        if gpu_layers and not llama_cpp.llama_supports_gpu_offload():
            raise GenerationError(
                "gpu_layers was asked for, but this llama.cpp build has no GPU backend",
                hint="rebuild llama-cpp-python with CUDA, Metal or Vulkan, or use gpu_layers=0",
            )
        route_llamacpp_logs()
        try:
            self._llm = llama_cpp.Llama(
                model_path=str(path),
                n_ctx=n_ctx,
                n_threads=n_threads,
                n_threads_batch=n_threads,
                n_batch=batch,
                type_k=KV_TYPES[kv],
                type_v=KV_TYPES[kv],
                # llama.cpp stores a quantized V cache only with flash attention.
                flash_attn=kv not in ("f16", "f32", "bf16"),
                use_mmap=mmap,
                use_mlock=mlock,
                n_gpu_layers=gpu_layers,
                seed=seed if seed is not None else llama_cpp.LLAMA_DEFAULT_SEED,
                logits_all=logits,
                verbose=False,
            )
        except (ValueError, RuntimeError) as exc:
            raise GenerationError(
                f"llama.cpp could not load {path}: {exc}", hint="run with -v to see llama.cpp's log"
            ) from exc
        self._llama_cpp = llama_cpp
        self._add_bos = bool(header.get("tokenizer.ggml.add_bos_token", False))
        self._template = header.get("tokenizer.chat_template")
        self._keep_logits = logits
        self.info = SessionInfo(
            target=LlamaCppTarget.info.name,
            model_path=str(path),
            context_length=n_ctx,
            threads=n_threads,
            kv_cache=kv,
            settings={"batch": batch, "mmap": mmap, "mlock": mlock, "gpu_layers": gpu_layers},
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
        if sampling.seed is not None:
            llm.set_seed(sampling.seed)
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

    def render_chat(self, messages: Sequence[dict[str, str]]) -> str:
        self._check_open()
        if not isinstance(self._template, str):
            raise GenerationError(
                f"{self.info.model_path} has no chat template",
                hint="use generate() with a plain prompt",
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
