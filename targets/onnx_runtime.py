"""A Session over ONNX Runtime GenAI (onnxruntime-genai): one ONNX variant folder, run on
the CPU execution provider or on the provider its own genai_config.json names.

The target (targets/qnn.py) decides which execution provider runs (``Provider``) from the
device asked for, the providers present and the variant; this module runs it:

- CPU: ``og.Config(folder).clear_providers()``, so the CPU provider runs the graph whatever
  the config names. NPU: the config as the variant ships it (its provider options, as an
  Android app using onnxruntime-genai loads it).
- One ``og.Generator`` per generation, sized to that generation (``max_length`` = prompt +
  the tokens it may make: the KV cache is allocated at max_length). Greedy and sampling
  are onnxruntime-genai's own search (``set_search_options``); min_p, which it lacks, is
  applied to the logits before each sampled token (``set_logits``), on the distribution
  before temperature as llama.cpp does. ``ignore_eos``: at an end-of-sequence token the
  generator is done, so the token is appended again and generation goes on (the same
  tokens as a generator whose EOS is another id: checked by hand on the tiny model).
- Tokens: the folder's tokenizer.json run by Hugging Face ``tokenizers`` (the library
  transformers runs), not onnxruntime-genai's tokenizer: that one adds no BOS for
  Llama-style models, merges whitespace runs of SentencePiece-style vocabularies
  differently (Mistral: "a  b" is [▁, ▁b] there, [▁▁, b] in transformers) and decodes
  them with a leading space (measured on the tiny models, onnxruntime-genai 0.18.0).
- Stop strings and UTF-8: ``StopMatcher`` over ``tokenizers``' ``DecodeStream``.
- ``logits``: the whole sequence in one ``append_tokens`` and the graph's own logits output
  ([1, n, vocabulary]: the builder's graphs give every position), one prefill instead of n
  decode steps; a graph that gives only the last position (a static-shape pipeline) is fed
  token by token instead, reading each step's logits.

Every setting is checked before onnxruntime-genai sees it (targets/checks.py), and every
folder before it opens a file (targets/onnx_folder.py).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psutil
from edgekit.targets import checks
from edgekit.targets.hf_tokens import TextStream, bos_added, open_tokenizer
from edgekit.targets.onnx_folder import GenaiFolder
from edgekit.targets.runtime_calls import backend_errors
from edgekit.targets.session import Session
from edgekit.targets.templates import NO_TEMPLATE_HINT, render_chat_template
from edgekit.targets.values import Sampling, SessionInfo, StreamChunk

from edgekit.errors import GenerationError, TargetUnavailableError

if TYPE_CHECKING:
    import numpy as np

DEFAULT_CONTEXT = 4096
SEED_SPAN = 1 << 31  # onnxruntime-genai's random_seed is a non-negative int32 (negative: random)
INSTALL_HINT = "pip install 'edgekit[onnx]'"
_DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "uint8": "u8", "int8": "i8"}


@dataclass(frozen=True, kw_only=True)
class Provider:
    """The execution provider a session runs on, as the target chose it."""

    label: str  # how SessionInfo.settings names it ("cpu", or the accelerator's provider)
    unit: str  # the compute unit, as the planner names units
    execution_provider: str  # ONNX Runtime's name, e.g. CPUExecutionProvider
    keep_config: bool  # True: the variant's own provider options; False: the CPU provider


class GenaiSession(Session):
    def __init__(
        self,
        folder: GenaiFolder,
        *,
        target: str,
        provider: Provider,
        context: int | None = None,
        threads: int | None = None,
        logits: bool = False,  # accepted for the shared API: logits() always works here
    ) -> None:
        super().__init__()
        checks.flag("logits", logits)
        n_ctx = (
            min(folder.context_length, DEFAULT_CONTEXT)
            if context is None
            else checks.integer(
                "context",
                context,
                low=2,
                high=folder.context_length,
                note="the context the model was exported for",
            )
        )
        n_threads = (
            psutil.cpu_count(logical=False) or 1
            if threads is None
            else checks.integer("threads", threads, low=1, high=checks.max_threads())
        )
        try:
            import onnxruntime_genai as og
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise TargetUnavailableError(f"{exc.name} is not installed", hint=INSTALL_HINT) from exc
        self._og = og
        self._folder = folder
        self._context = n_ctx
        self._closed = False
        with backend_errors(target, f"loading {folder.path} on {provider.execution_provider}"):
            config = og.Config(str(folder.path))
            if not provider.keep_config:
                config.clear_providers()
            if threads is not None:  # else ONNX Runtime's default: one per physical core
                options = {"intra_op_num_threads": n_threads}
                config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
            self._model = og.Model(config)
            self._tokenizer = open_tokenizer(Tokenizer, folder.path)
            # on the CPU a one-token run checks the graph; a static-shape NPU pipeline
            # runs only the shapes it was compiled for
            kv = "unknown" if provider.keep_config else self._warm_up()
        self.info = SessionInfo(
            target=target,
            model_path=str(folder.path),
            context_length=n_ctx,
            threads=n_threads,
            kv_cache=kv,
            settings={
                "provider": provider.label,
                "execution_provider": provider.execution_provider,
                "model_type": folder.model_type,
            },
            vocab_size=folder.vocab_size,
            unit=provider.unit,
        )

    def _warm_up(self) -> str:
        """Run one token through the model (a model that loads but cannot run fails at
        load, not at the first prompt) and read its KV cache type from the output."""
        params = self._og.GeneratorParams(self._model)
        params.set_search_options(max_length=self._max_length(self._padded(1) + 1), do_sample=False)
        generator = self._og.Generator(self._model, params)
        generator.append_tokens([self._folder.eos_ids[0]])
        try:
            present = generator.get_output(self._folder.present_key_name % 0)
        except Exception:  # noqa: BLE001 - a pipeline may not expose it: the type is unknown
            return "unknown"
        return _DTYPES.get(str(present.dtype), str(present.dtype))

    def _max_length(self, needed: int) -> int:
        """A generator's max_length for ``needed`` positions: at least the shortest the
        model takes (its sliding window), at most what it was exported for. The session
        stops at ``needed`` itself."""
        return min(self._folder.context_length, max(needed, self._folder.shortest))

    def _padded(self, n: int) -> int:
        """The KV positions a prompt of ``n`` tokens takes: a static pipeline runs it in
        windows and its last window's padding takes positions too (onnxruntime-genai
        0.18; a generator sized below that writes past its buffers: measured, the
        process aborted in malloc)."""
        window = self._folder.prompt_window
        return -(-n // window) * window if window else n

    # --- tokens -------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        self._check_open()
        return list(self._tokenizer.encode(text, add_special_tokens=add_special).ids)

    def detokenize(self, tokens: Sequence[int]) -> str:
        self._check_open()
        return str(self._tokenizer.decode(list(tokens), skip_special_tokens=True))

    def _control_texts(self) -> tuple[str, ...]:
        """The special tokens of the Hugging Face tokenizer files, BOS and EOS included:
        ``tokenizers`` always parses them, so message text holding one is encoded in
        pieces (Session._text_tokens)."""
        return self._folder.tokenizer.specials

    # --- generation ---------------------------------------------------------------------

    def stream_tokens(
        self, prompt_tokens: Sequence[int], sampling: Sampling
    ) -> Iterator[StreamChunk]:
        self._check_open()
        n = len(prompt_tokens)
        taken = self._padded(n)
        if taken >= self._context:
            padding = f" ({taken} with the prompt window's padding)" if taken != n else ""
            raise GenerationError(
                f"the prompt has {n} tokens{padding}; the context holds {self._context}",
                hint="shorten the prompt or load with a larger context",
            )
        budget = min(sampling.max_tokens, self._context - taken)
        params = self._og.GeneratorParams(self._model)
        params.set_search_options(
            **self._search_options(sampling, self._max_length(taken + budget))
        )
        generator = self._og.Generator(self._model, params)
        try:
            generator.append_tokens(list(prompt_tokens))
            yield from self._tokens(generator, sampling, budget)
        finally:
            del generator  # frees its KV cache now, not at the next collection

    def _search_options(self, sampling: Sampling, max_length: int) -> dict[str, Any]:
        """onnxruntime-genai's search options for ``sampling``, every one set on every
        call (no call's seed stays behind for the next)."""
        seed = secrets.randbelow(SEED_SPAN) if sampling.seed is None else sampling.seed
        options: dict[str, Any] = {
            "max_length": max_length,
            "do_sample": sampling.temperature > 0,
            "repetition_penalty": sampling.repeat_penalty,
            "random_seed": seed % SEED_SPAN,
        }
        if sampling.ignore_eos and self._folder.prompt_window:
            # a pipeline's generator takes no tokens after generating (0.18), so it cannot
            # go on past an EOS as _tokens does: the EOS is never picked instead
            options["min_length"] = max_length
        if sampling.temperature > 0:
            options.update(
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                # 0 is "off" in both; onnxruntime-genai refuses more than the vocabulary
                top_k=min(sampling.top_k, self._folder.vocab_size),
            )
        return options

    def _tokens(self, generator: Any, sampling: Sampling, budget: int) -> Iterator[StreamChunk]:
        text = TextStream(self._tokenizer, sampling.stop)
        cancel = self._cancel  # this generation's token
        eos = set(self._folder.eos_ids)
        min_p = sampling.min_p if sampling.temperature > 0 else 0.0
        count = 0
        last = -1
        while True:
            if cancel.is_set():
                yield StreamChunk(text=text.end(), tokens=0, finish_reason="cancelled")
                return
            if generator.is_done():  # only after an EOS with ignore_eos: go on past it
                generator.append_tokens([last])
            if min_p > 0:
                generator.set_logits(_min_p_logits(generator.get_logits(), min_p))
            generator.generate_next_token()
            last = int(generator.get_next_tokens()[0])
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
        if files.bos and text.startswith(files.bos) and self._adds(files.bos):
            return text[len(files.bos) :]
        return text

    def _adds(self, token: str) -> bool:
        """Whether tokenization with special tokens puts ``token`` first (BOS)."""
        return bos_added(self._tokenizer, token)

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Logits of every position (see the module text for how)."""
        import numpy as np

        self._check_open()
        ids = list(tokens)
        if self._folder.prompt_window:
            return self._pipeline_logits(ids)
        params = self._og.GeneratorParams(self._model)
        params.set_search_options(max_length=self._max_length(len(ids)), do_sample=False)
        generator = self._og.Generator(self._model, params)
        generator.append_tokens(ids)
        out = np.asarray(generator.get_output(self._folder.logits_name))
        if out.shape == (1, len(ids), self._folder.vocab_size):
            return np.array(out[0], dtype=np.float32)
        del generator
        generator = self._og.Generator(self._model, params)
        rows = []
        for token in ids:
            generator.append_tokens([token])
            rows.append(np.asarray(generator.get_logits(), dtype=np.float32).reshape(-1))
        return np.stack(rows)

    def _pipeline_logits(self, ids: list[int]) -> np.ndarray:
        """A static pipeline gives the last position's logits and takes no second
        append_tokens (0.18: the first fills the generator to max_length): one fresh
        generator per prefix (checked against the builder's graph on the tiny model:
        within 2e-6 at every position, prompts of 1 to 100 tokens)."""
        import numpy as np

        if self._padded(len(ids)) >= self._folder.context_length:
            raise GenerationError(
                f"{len(ids)} tokens ({self._padded(len(ids))} with the prompt window's "
                f"padding) do not fit the {self._folder.context_length} positions the "
                "pipeline was compiled for",
                hint="ask for the logits of fewer tokens",
            )
        rows = []
        for end in range(1, len(ids) + 1):
            params = self._og.GeneratorParams(self._model)
            length = self._max_length(self._padded(end) + 1)
            params.set_search_options(max_length=length, do_sample=False)
            generator = self._og.Generator(self._model, params)
            generator.append_tokens(ids[:end])
            rows.append(np.asarray(generator.get_logits(), dtype=np.float32).reshape(-1))
            del generator
        return np.stack(rows)

    # --- lifetime -------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise GenerationError("the session is closed", hint="load the model again")

    def _close(self) -> None:
        if not self._closed:
            self._closed = True
            del self._tokenizer
            del self._model  # the last reference: onnxruntime-genai frees the session


def _min_p_logits(logits: np.ndarray, min_p: float) -> np.ndarray:
    """``logits`` with every token below ``min_p`` x the top token's probability masked
    (on the distribution before temperature, as llama.cpp applies min_p)."""
    import numpy as np

    floor = logits.max(axis=-1, keepdims=True) + np.log(min_p)
    # the lowest finite float, not -inf: no inf - inf in the sampler's softmax
    lowest = np.finfo(np.float32).min
    return np.where(logits >= floor, logits, lowest).astype(np.float32)
