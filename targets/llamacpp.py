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

import logging
import re
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from edgekit.converters.formats import Format
from edgekit.converters.gguf import FORMAT
from edgekit.converters.gguf.llamacpp_log import route_llamacpp_logs
from edgekit.targets import checks
from edgekit.targets.contract import Coefficients, KvCacheLayout, Target, UnitSupport
from edgekit.targets.llamacpp_runtime import Settings, open_llama, read_settings
from edgekit.targets.session import Session
from edgekit.targets.streams import StopMatcher, Utf8Stream
from edgekit.targets.templates import NO_TEMPLATE_HINT, render_chat_template
from edgekit.targets.values import Sampling, SessionInfo, StreamChunk

from edgekit.errors import GenerationError, ModelNotFoundError, TargetUnavailableError
from edgekit.gguf_header import read_gguf_header

if TYPE_CHECKING:
    import numpy as np

    from edgekit.devices import Accelerator, DeviceProfile
    from edgekit.modelspec import ModelSpec

log = logging.getLogger(__name__)

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
    "parallel",
)


MB = 1 << 20
# llama.cpp's runtime buffers beyond weights and KV cache on a CPU: 48 MiB of compute
# buffers and libraries + the output buffer, vocabulary x 4 bytes x 64 rows. Fitted on
# this project's machine: SmolLM2-135M Q4_1 measured 170.6 / 254.6 / 349.0 MB above the
# process baseline at contexts 512 / 4096 / 8192, against 171.2 / 254.6 / 349.0 MB.
RUNTIME_BASE = 48 * MB
OUTPUT_BUFFER_ROWS = 64
# The formats planned on either unit, most precise first.
_PLANNED = ("F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "Q3_K_M", "Q2_K")
_UBATCH = 512  # llama-cpp-python's n_ubatch (edgekit does not set it)
# device (edgekit.load's device=) -> GPU layers: only "gpu" offloads (all layers)
_GPU_LAYERS = {"auto": 0, "cpu": 0, "gpu": -1}


class LlamaCppTarget(Target):
    """llama.cpp: GGUF files on any CPU, or on a Metal or CUDA GPU when built so."""

    name: ClassVar[str] = "llamacpp"
    display_name: ClassVar[str] = "llama.cpp (GGUF)"
    devices: ClassVar[str] = (
        "any CPU (x86 AVX2/AVX-512, Arm NEON); Metal, CUDA or Vulkan GPUs when built so"
    )
    format: ClassVar[Format] = FORMAT
    install_hint: ClassVar[str] = "pip install 'edgekit[gguf]'"
    sdk_modules: ClassVar[tuple[str, ...]] = ("llama_cpp",)
    distribution: ClassVar[str] = "llama-cpp-python"
    priority: ClassVar[int] = 0  # the default target: runs everywhere, packs one file
    load_settings: ClassVar[tuple[str, ...]] = SETTINGS
    devices_accepted: ClassVar[tuple[str, ...]] = tuple(_GPU_LAYERS)
    # First estimates; reasoning, in order of the fields:
    #  CPU: token generation reaches ~50-60% of DRAM bandwidth on desktop and phone CPUs
    #    (llama.cpp CPU benchmarks, e.g. discussion #4167's CPU rows); ~0.5 ms per token of
    #    sampling and Python; prefill ~40% of fp32 peak (int8 dot products on quantized
    #    rows); runtime per model (``priors``); the file is mmapped.
    #  GPU (Metal, CUDA): M-series Q4_0 7B token generation is ~60-65% of the spec
    #    bandwidth (discussion #4167: M1 Pro 36 tok/s at 200 GB/s, M3 Max 66 tok/s at
    #    400 GB/s); CUDA context and compute buffers add ~300 MB.
    units: ClassVar[tuple[UnitSupport, ...]] = (
        UnitSupport(
            kind="cpu",
            formats=_PLANNED,
            priors=Coefficients(
                bandwidth_efficiency=0.55,
                token_overhead_s=0.0005,
                compute_efficiency=0.4,
                runtime_bytes=RUNTIME_BASE,  # + the output buffer: priors()
                weight_residency=1.0,
                kv_preallocated=True,
            ),
        ),
        UnitSupport(
            kind="gpu",
            formats=_PLANNED,
            priors=Coefficients(
                bandwidth_efficiency=0.62,
                token_overhead_s=0.001,
                compute_efficiency=0.35,
                runtime_bytes=300 * MB,
                weight_residency=1.0,
                kv_preallocated=True,
            ),
        ),
    )
    # The gemma3 graph's iSWA cache (llama-kv-cache-iswa.cpp, ``swa_full`` off): windowed
    # layers hold pad256(min(pad256(ctx), window + n_ubatch)) cells, the others
    # pad256(ctx); n_ubatch is 512 in llama-cpp-python. Its phi3 graph disables the window
    # and its llama (Mistral) and qwen2 graphs have none: full cache on every layer.
    kv_cache: ClassVar[KvCacheLayout] = KvCacheLayout(
        windowed_families=frozenset({"gemma3"}), pad=256, window_extra=_UBATCH
    )

    @classmethod
    def accelerators(cls, profile: DeviceProfile) -> list[Accelerator]:
        """The GPU when the device has a Metal or CUDA one, else the CPU."""
        by_kind = {a.kind: a for a in profile.accelerators}
        gpu = by_kind.get("gpu")
        if gpu and (gpu.runtime_device or "").startswith(("metal", "cuda")):
            return [gpu]
        return [by_kind["cpu"]] if "cpu" in by_kind else []

    @classmethod
    def priors(cls, kind: str, spec: ModelSpec) -> Coefficients:
        """On a CPU the output buffer grows with the vocabulary."""
        c = super().priors(kind, spec)
        extra = cls.vocab_runtime_bytes(kind, spec)
        return replace(c, runtime_bytes=c.runtime_bytes + extra) if extra else c

    @classmethod
    def vocab_runtime_bytes(cls, kind: str, spec: ModelSpec) -> int:
        return spec.vocab_size * 4 * OUTPUT_BUFFER_ROWS if kind == "cpu" else 0

    @classmethod
    def check_host(cls) -> tuple[bool, str]:
        """The CPU features this build switched on, and whether it offloads to a GPU."""
        import llama_cpp

        info = llama_cpp.llama_print_system_info().decode(errors="replace")
        # "CPU : SSE3 = 1 | AVX2 = 1 | ..." -> the features switched on in this build
        features = [m.group(1) for m in re.finditer(r"(\w+) = 1", info)]
        gpu = bool(llama_cpp.llama_supports_gpu_offload())
        backends = "CPU" + (" + GPU offload" if gpu else "")
        return True, f"backends: {backends}; CPU features: {', '.join(features) or 'none'}"

    @classmethod
    def device_settings(cls, device: str) -> dict[str, Any]:
        """``gpu`` offloads every layer; ``auto`` and ``cpu`` keep the defaults."""
        super().device_settings(device)  # refuses a device llama.cpp does not know
        return {"gpu_layers": _GPU_LAYERS[device]} if device == "gpu" else {}

    @classmethod
    def load(cls, model: str | Path, **settings: Any) -> LlamaCppSession:
        """Load a GGUF file.

        Settings: ``context`` (tokens), ``threads``, ``batch``, ``kv_cache`` (f16, q8_0, ...),
        ``mmap``, ``mlock``, ``gpu_layers`` (-1: all, when the build has a GPU backend),
        ``seed``, ``logits`` (keep logits of every position; needed by ``logits()``),
        ``parallel`` (N > 1: N generations decoded together, each with ``context`` tokens of
        its own KV cache: continuous batching, targets/llamacpp_batch.py).

        Raises:
            TargetUnavailableError: llama-cpp-python is not installed.
            ModelFormatError: not a readable GGUF file.
            SettingError: an unknown setting, or one of the wrong type or out of range.
            GenerationError: llama.cpp refused the file.
        """
        checks.known_settings(settings, SETTINGS, what="llama.cpp setting")
        return LlamaCppSession(Path(model), settings)


class LlamaCppSession(Session):
    def __init__(self, path: Path, given: dict[str, Any]) -> None:
        super().__init__()
        try:
            import llama_cpp
        except ImportError as exc:
            raise TargetUnavailableError(
                "llama-cpp-python is not installed", hint="pip install 'edgekit[gguf]'"
            ) from exc
        if not path.is_file():
            raise ModelNotFoundError(
                f"{path}: no such GGUF file", hint="pass the path of a .gguf model file"
            )
        header = read_gguf_header(path)  # raises ModelFormatError with the reason
        settings = read_settings(given, header)
        if settings.gpu_layers and not llama_cpp.llama_supports_gpu_offload():
            raise GenerationError(
                "gpu_layers was asked for, but this llama.cpp build has no GPU backend",
                hint="rebuild llama-cpp-python with CUDA, Metal or Vulkan, or use gpu_layers=0",
            )
        kv = settings.kv_cache
        route_llamacpp_logs()
        self._llm = open_llama(path, settings)
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
            target=LlamaCppTarget.name,
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
            unit="gpu" if settings.gpu_layers else "cpu",  # refused above without a GPU backend
        )
        self._closed = False
        if settings.parallel > 1:
            self._start_batch(settings)

    def _start_batch(self, settings: Settings) -> None:
        from edgekit.targets.llamacpp_batch import open_batch

        try:
            runtime = open_batch(
                self._llm,
                slots=settings.parallel,
                context=settings.context,
                threads=settings.threads,
                batch=max(settings.batch, settings.parallel),
                kv_cache=settings.kv_cache,
                seed=settings.seed,
            )
        except BaseException:
            self._llm.close()  # the model is freed now, not when the traceback goes
            raise
        self._use_batching(runtime)
        self.info.settings["parallel"] = settings.parallel

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
        cancel = self._cancel  # this generation's token
        try:
            for token in generator:
                if cancel.is_set():
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
        if len(tokens) > self._llm.n_ctx():  # a batched session keeps a small one
            raise GenerationError(
                f"logits of {len(tokens)} tokens: this session's scoring context holds "
                f"{self._llm.n_ctx()}",
                hint="load without parallel (or with a larger context) to score longer texts",
            )
        self._llm.reset()  # type: ignore[no-untyped-call]
        self._llm.eval(list(tokens))
        return np.array(self._llm.scores[: len(tokens)], dtype=np.float32)

    def clear_cache(self) -> None:
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
