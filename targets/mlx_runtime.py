"""A Session over MLX through mlx-lm: one MLX variant folder (targets/mlx_folder.py checks
it first), run on MLX's default device (the Metal GPU on Apple silicon; the CPU backend of
``mlx[cpu]`` on Linux).

- Loading: ``mlx_lm.utils.load_model`` with the model class edgekit picks from the checked
  model_type (not mlx_lm's import of the config's string) and the checked config given as
  overrides, so a key written after the check (``model_file``: code to run) is void.
- Tokens: the folder's tokenizer.json run by Hugging Face ``tokenizers``, shared with the
  ONNX session (targets/hf_tokens.py), not mlx_lm's TokenizerWrapper: the same tokens as
  transformers, and no transformers import at load.
- Generation: ``mlx_lm.generate.generate_step`` over a ``make_prompt_cache`` cache, with
  ``mlx_lm.sample_utils.make_sampler`` (temperature, top_p, min_p, top_k; mlx-lm applies
  min_p to the log-probabilities before temperature, as llama.cpp does) and
  ``make_logits_processors`` for a repeat penalty (mlx-lm's: the last 20 tokens). The seed
  (given, else drawn) seeds MLX's global generator at the start of every generation.
- KV cache: ``kv_bits`` (8 for q8_0, 4 for q4_0; group 64, from the first token on) reach
  generate_step, which turns each layer's cache into a QuantizedKVCache after the
  prompt's prefill. f16 / bf16 / f32 all mean "not quantized": MLX keeps the cache in the
  dtype the model computes in, which ``SessionInfo.kv_cache`` names.
- ``logits``: one forward pass over the sequence ([n, vocabulary] float32). With a
  quantized KV cache the first token is run alone, its cache quantized, and the rest run
  in one pass attending to the quantized cache, so the logits are those of the cache the
  session generates with.
- ``parallel`` N > 1: generations run N at once through mlx-lm's BatchGenerator
  (targets/mlx_batch.py), each request with the sampler this session would give it
  (``sampler_for``, ``generation_seed``); its KV cache is never quantized, so a quantized
  ``kv_cache`` is refused with it.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from edgekit.targets import checks
from edgekit.targets.hf_tokens import TextStream, bos_added, open_tokenizer
from edgekit.targets.mlx_folder import MlxFolder
from edgekit.targets.runtime_calls import backend_errors
from edgekit.targets.session import Session
from edgekit.targets.templates import NO_TEMPLATE_HINT, render_chat_template
from edgekit.targets.values import Sampling, SessionInfo, StreamChunk

from edgekit.errors import (
    GenerationError,
    ModelFormatError,
    SettingError,
    TargetUnavailableError,
)

if TYPE_CHECKING:
    import numpy as np

DEFAULT_CONTEXT = 4096
INSTALL_HINT = "pip install 'edgekit[mlx]'"
KV_BITS = {"f16": None, "bf16": None, "f32": None, "q8_0": 8, "q4_0": 4}
KV_GROUP = 64
SEED_SPAN = 1 << 32  # mx.random.seed takes an unsigned 64-bit seed; Sampling's fit in 32
MAX_PARALLEL = 64  # as llama.cpp's and OpenVINO's batched sessions


def kv_bits(kv_cache: str) -> int | None:
    """The KV-cache bits of a ``kv_cache`` setting (None: not quantized)."""
    return KV_BITS[kv_cache]


def generation_seed(sampling: Sampling) -> int:
    """The seed a generation draws with: the one given, else a fresh random one."""
    return secrets.randbelow(SEED_SPAN) if sampling.seed is None else sampling.seed


def sampler_for(
    samplers: Any, sampling: Sampling, vocab_size: int
) -> tuple[Callable[[Any], Any], list[Any] | None]:
    """mlx-lm's sampler and logits processors for ``sampling`` (``samplers`` is
    mlx_lm.sample_utils): the one mapping of edgekit's sampling settings onto mlx-lm's,
    for the single-stream session and the batched runtime alike."""
    temperature = sampling.temperature
    sampler = samplers.make_sampler(
        temp=temperature,
        top_p=sampling.top_p,
        min_p=sampling.min_p if temperature > 0 else 0.0,
        # 0 is "off" in both; the whole vocabulary or more keeps every token, which
        # mlx-lm refuses as a top_k (it takes 1 to vocabulary - 1): off too
        top_k=sampling.top_k if sampling.top_k < vocab_size else 0,
    )
    processors = (
        samplers.make_logits_processors(repetition_penalty=sampling.repeat_penalty)
        if sampling.repeat_penalty != 1.0
        else None
    )
    return sampler, processors


class MlxSession(Session):
    def __init__(
        self,
        folder: MlxFolder,
        *,
        target: str,
        unit: str,
        context: int | None = None,
        kv_cache: str | None = None,
        logits: bool = False,  # accepted for the shared API: logits() always works here
        parallel: int = 1,
    ) -> None:
        super().__init__()
        checks.flag("logits", logits)
        parallel = checks.integer("parallel", parallel, low=1, high=MAX_PARALLEL, note="streams")
        n_ctx = (
            min(folder.context_length, DEFAULT_CONTEXT)
            if context is None
            else checks.integer(
                "context",
                context,
                low=2,
                high=folder.context_length,
                note="the model's max_position_embeddings",
            )
        )
        # the default: what the recipe asked for (edgekit.json), else not quantized
        # only None is the default: an empty string is a setting, refused as one
        default = folder.kv_cache or "f16"
        kv = checks.choice("kv_cache", default if kv_cache is None else kv_cache, tuple(KV_BITS))
        if parallel > 1:  # before the model is read
            from edgekit.targets.mlx_batch import refuse_quantized_cache

            refuse_quantized_cache(kv, recorded=kv_cache is None)
        try:
            import importlib

            import mlx.core as mx
            from mlx_lm import sample_utils
            from mlx_lm.models import cache as mlx_cache
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise TargetUnavailableError(f"{exc.name} is not installed", hint=INSTALL_HINT) from exc
        self._mx = mx
        # the module (mlx_lm's package exports a function of the same name)
        self._generate = importlib.import_module("mlx_lm.generate")
        self._samplers = sample_utils
        self._caches = mlx_cache
        self._folder = folder
        self._context = n_ctx
        self._kv_bits = kv_bits(kv)
        self._closed = False
        # MLX is not safe to drive from two threads at once: with a batch loop running,
        # logits() on a caller's thread and the loop's steps take turns on this lock
        self._mlx_lock = threading.RLock()
        with backend_errors(target, f"loading {folder.path}"):
            self._tokenizer = open_tokenizer(Tokenizer, folder.path)
            _check_tokenizer_vocab(self._tokenizer, folder)
            self._model = _load_model(folder)
            self._refuse_unquantizable_cache(kv)
        self.info = SessionInfo(
            target=target,
            model_path=str(folder.path),
            context_length=n_ctx,
            # MLX has no thread setting: reported as the physical cores on the CPU (what
            # the other targets default to), one host thread on the GPU
            threads=1 if unit == "gpu" else _cpu_threads(),
            kv_cache=folder.activation_dtype.lower() if self._kv_bits is None else kv,
            settings={
                "device": str(mx.default_device()),
                "model_type": folder.model_type,
                "kv_bits": self._kv_bits,
                "kv_group_size": KV_GROUP if self._kv_bits else None,
            },
            vocab_size=folder.vocab_size,
            unit=unit,
        )
        if parallel > 1:
            self._start_batch(target, parallel)

    def _start_batch(self, target: str, parallel: int) -> None:
        """Generations from now on run ``parallel`` at once (targets/mlx_batch.py)."""
        from edgekit.targets.mlx import kv_cache_bytes
        from edgekit.targets.mlx_batch import open_batch

        try:
            with backend_errors(target, f"opening {parallel} streams"):
                runtime = open_batch(
                    self._model,
                    slots=parallel,
                    context=self._context,
                    eos_ids=self._folder.eos_ids,
                    vocab_size=self._folder.vocab_size,
                    kv_bits=self._kv_bits,
                    kv_bytes=kv_cache_bytes(self._folder, self._context, None),
                    lock=self._mlx_lock,
                )
        except BaseException:
            self._close()  # the model is freed now, not when the traceback goes
            raise
        self._use_batching(runtime)
        self.info.settings["parallel"] = parallel

    def _refuse_unquantizable_cache(self, kv: str) -> None:
        """Refuse at load, not at the first prompt, a quantized kv_cache mlx-lm 0.31
        cannot make: heads not a whole number of groups, a sliding-window (rotating)
        cache."""
        if self._kv_bits is None:
            return
        if self._folder.head_dim % KV_GROUP:
            raise SettingError(
                f"kv_cache {kv}: mlx-lm quantizes the KV cache in groups of {KV_GROUP} "
                f"values of a head; this model's heads have {self._folder.head_dim}",
                hint="load it with kv_cache='f16'",
            )
        rotating = [
            c
            for c in self._caches.make_prompt_cache(self._model)
            if isinstance(c, self._caches.RotatingKVCache)
        ]
        if rotating:
            raise SettingError(
                f"kv_cache {kv}: mlx-lm cannot quantize the sliding-window cache of "
                f"{self._folder.model_type} layers",
                hint="load it with kv_cache='f16'",
            )

    # --- tokens -------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        self._check_open()
        return list(self._tokenizer.encode(text, add_special_tokens=add_special).ids)

    def detokenize(self, tokens: Sequence[int]) -> str:
        self._check_open()
        return str(self._tokenizer.decode(list(tokens), skip_special_tokens=True))

    def _control_texts(self) -> tuple[str, ...]:
        """The special tokens of the Hugging Face tokenizer files, BOS and EOS included:
        ``tokenizers`` always parses them (Session._text_tokens)."""
        return self._folder.tokenizer.specials

    def render_chat(self, messages: Sequence[dict[str, str]]) -> str:
        self._check_open()
        files = self._folder.tokenizer
        if files.template is None:
            raise GenerationError(
                f"{self._folder.path} has no chat template", hint=NO_TEMPLATE_HINT
            )
        text = render_chat_template(
            files.template, messages, bos_token=files.bos, eos_token=files.eos
        )
        # The template may write BOS itself; tokenize() adds it when the model wants it.
        if files.bos and text.startswith(files.bos) and bos_added(self._tokenizer, files.bos):
            return text[len(files.bos) :]
        return text

    # --- generation ---------------------------------------------------------------------

    def stream_tokens(
        self, prompt_tokens: Sequence[int], sampling: Sampling
    ) -> Iterator[StreamChunk]:
        self._check_open()
        n = len(prompt_tokens)
        if n >= self._context:
            raise GenerationError(
                f"the prompt has {n} tokens; the context holds {self._context}",
                hint="shorten the prompt or load with a larger context",
            )
        budget = min(sampling.max_tokens, self._context - n)
        mx = self._mx
        mx.random.seed(generation_seed(sampling))
        steps = self._generate.generate_step(
            mx.array(list(prompt_tokens)),
            self._model,
            max_tokens=budget,
            **self.step_options(sampling),
        )
        try:
            yield from self._tokens(steps, sampling, budget)
        finally:
            steps.close()  # frees the generation's KV cache now

    def step_options(self, sampling: Sampling) -> dict[str, Any]:
        """generate_step's keyword arguments for ``sampling`` on this session: the
        sampler, the logits processors, a fresh prompt cache and the KV bits (the
        benchmark calls generate_step with these to measure edgekit's overhead)."""
        sampler, processors = sampler_for(self._samplers, sampling, self._folder.vocab_size)
        return {
            "sampler": sampler,
            "logits_processors": processors,
            "prompt_cache": self._caches.make_prompt_cache(self._model),
            "kv_bits": self._kv_bits,
            "kv_group_size": KV_GROUP,
            "quantized_kv_start": 0,
        }

    def _tokens(
        self, steps: Iterator[tuple[Any, Any]], sampling: Sampling, budget: int
    ) -> Iterator[StreamChunk]:
        text = TextStream(self._tokenizer, sampling.stop)
        cancel = self._cancel  # this generation's token
        eos = set(self._folder.eos_ids)
        count = 0
        for token, _ in steps:
            if cancel.is_set():
                yield StreamChunk(text=text.end(), tokens=0, finish_reason="cancelled")
                return
            last = int(token)
            if last in eos and not sampling.ignore_eos:
                yield StreamChunk(text=text.end(), tokens=0, finish_reason="stop")
                return
            count += 1
            piece, stopped = text.feed(last)
            if stopped:
                yield StreamChunk(text=piece, tokens=1, finish_reason="stop")
                return
            if count >= budget:
                yield StreamChunk(text=piece + text.end(), tokens=1, finish_reason="length")
                return
            yield StreamChunk(text=piece, tokens=1)
        # generate_step makes exactly ``budget`` tokens: the loop returns at the last one
        raise GenerationError(
            f"mlx-lm stopped after {count} of {budget} tokens", hint="load the model again"
        )

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Logits of every position (see the module text for how)."""
        import numpy as np

        self._check_open()
        mx = self._mx
        ids = mx.array([list(tokens)])
        with self._mlx_lock, mx.stream(self._generate.generation_stream):
            if self._kv_bits is None:
                out = self._model(ids)
            else:
                cache = self._caches.make_prompt_cache(self._model)
                first = self._model(ids[:, :1], cache=cache)
                self._generate.maybe_quantize_kv_cache(cache, 0, KV_GROUP, self._kv_bits)
                rest = self._model(ids[:, 1:], cache=cache) if ids.shape[1] > 1 else None
                out = first if rest is None else mx.concatenate([first, rest], axis=1)
            out = out[0].astype(mx.float32)
            mx.eval(out)
        return np.array(out, dtype=np.float32)

    # --- lifetime -------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise GenerationError("the session is closed", hint="load the model again")

    def _close(self) -> None:
        if not self._closed:
            self._closed = True
            del self._tokenizer
            del self._model
            self._mx.clear_cache()  # MLX keeps freed buffers for reuse: give them back


def _load_model(folder: MlxFolder) -> Any:
    """The model of ``folder``, its class from the checked model_type and its config the
    checked one (see the module text)."""
    import importlib

    from mlx_lm.utils import load_model

    module = importlib.import_module(f"mlx_lm.models.{folder.module}")

    def classes(config: dict[str, Any]) -> tuple[Any, Any]:
        return module.Model, module.ModelArgs

    overrides = {**folder.config, "model_file": None, "quantize_activations": False}
    model, _ = load_model(folder.path, model_config=overrides, get_model_classes=classes)
    return model


def _cpu_threads() -> int:
    import psutil

    return psutil.cpu_count(logical=False) or 1


def _check_tokenizer_vocab(tokenizer: Any, folder: MlxFolder) -> None:
    """Every id the tokenizer can produce is a row of the embedding: an added token past
    vocab_size would index outside it in the model."""
    # the highest id, not the count: an added token may sit past a gap in the numbering
    ids = max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1) + 1
    ids = max(ids, tokenizer.get_vocab_size(with_added_tokens=True))
    if ids > folder.vocab_size:
        raise ModelFormatError(
            f"{folder.path / 'tokenizer.json'}: token ids reach {ids - 1:,}, past the "
            f"config's vocab_size {folder.vocab_size:,}",
            hint="the tokenizer does not belong to this model; convert the model again: "
            "edgekit convert MODEL --to mlx -o DIR",
        )
