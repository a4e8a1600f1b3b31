"""MLX's BatchRuntime (targets/batching.py): several generations at once on one loaded
model, through mlx-lm's own continuous batching, ``mlx_lm.generate.BatchGenerator``.

``open_batch`` makes a BatchGenerator on the model the single-stream session loaded (the
weights are not loaded twice) for ``slots`` sequences: each ``step`` is one
``BatchGenerator.next``, which decodes one token of every sequence that is generating
(one forward pass over the batch) and then evaluates prompt chunks of at most
``PREFILL_STEP`` tokens of those still prefilling, so a long prompt does not stall the
others for its whole length. mlx-lm pipelines its steps: the token a step returns was
computed by the step before, while the next one's forward pass runs asynchronously.

Every request has its own sampler and logits processors, made by the single-stream
session's mapping (``mlx_runtime.sampler_for``), and its own end-of-sequence rule
(mlx-lm's per-request ``SequenceStateMachine``: the model's end ids, or none with
ignore_eos); ``max_tokens`` given to mlx-lm is the room left in the sequence's context,
since ``max_tokens`` is the loop's. Seeds: mlx-lm's samplers draw from MLX's global random
state (per thread in MLX 0.32), which one batch shares across its requests; each request's
sampler (``_Seeded``) sets the state to its own key before its draw and reads the key back
after, so a request draws what the single-stream session draws with the same seed,
whatever else is in the batch.

KV cache: mlx-lm's BatchKVCache, never quantized (mlx-lm 0.31 batches no
QuantizedKVCache: a quantized ``kv_cache`` is refused, ``refuse_quantized_cache``). It
grows with use, in steps of 256 positions, to ``slots`` times the longest sequence (the
rows are left-padded to a common length).

Prefix reuse: mlx-lm's own prompt cache, ``LRUPromptCache`` (a trie of token sequences),
keeps the KV cache of each sequence that ended or was removed, keyed by its tokens (prompt
and generated). A new request takes a copy of the entry sharing the longest prefix with
its prompt, trimmed to that prefix (at least one prompt token is always evaluated, for
the logits its first token is sampled from), and evaluates only the rest;
``SeqStep.cached`` says how many tokens it did not compute. Kept entries are at most
``slots``, and their bytes are held, with the running sequences' cache, within the
``slots x context`` KV cache the load admitted. Models with a sliding-window (rotating)
cache (Gemma 3) run batched without reuse: the window no longer holds a prefix's start.

Where mlx-lm 0.31's batching differs from its single stream, the runtime follows the
single stream (``_processors``): its logits processors see the prompt's last token and
what was generated, not the whole prompt; and every request gets a processor list that is
not empty (GenerationBatch.filter drops nothing from the lists when all are empty, so a
repeat penalty joining later would read a departed request's empty list).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from edgekit.targets import checks
from edgekit.targets.batching import SeqRequest, SeqStep, check_admission
from edgekit.targets.mlx_runtime import MAX_PARALLEL, generation_seed, sampler_for
from edgekit.targets.runtime_calls import backend_errors

from edgekit.errors import BatchSettingError, GenerationError

log = logging.getLogger(__name__)

TARGET = "MLX"
# Prompt tokens a step evaluates per sequence: a chunk of 512 stalls the others' decoding
# a quarter as long as mlx-lm's default 2,048 would (MLX's CPU backend prefills a 135M
# model at ~8 tokens a second here: targets/mlx.py), at the cost of more chunks for a long
# prompt, whose logits may then differ from the single stream's in the last digits.
PREFILL_STEP = 512
# A shared prefix shorter than this is evaluated, not reused: a reuse copies the whole
# kept cache, which a handful of tokens hardly repays, and a BOS alone starts nearly
# every prompt.
MIN_REUSE = 4
_KEY = "model"  # LRUPromptCache keys its trie by model too: one runtime, one model


def refuse_quantized_cache(kv_cache: str, *, recorded: bool = False) -> None:
    """Refuse a quantized ``kv_cache`` (q8_0, q4_0) for parallel streams; ``recorded``:
    it is the variant's default (edgekit.json), not a setting given.

    Raises:
        SettingError: mlx-lm 0.31's BatchGenerator has no quantized batch cache.
    """
    if kv_cache in ("q8_0", "q4_0"):
        whose = " (the variant's recorded default)" if recorded else ""
        raise _quantized(f"kv_cache {kv_cache}{whose}")


def _quantized(what: str) -> BatchSettingError:
    return BatchSettingError(
        f"{what} cannot run parallel streams: mlx-lm 0.31's BatchGenerator batches only an "
        "unquantized KV cache (it has no batched QuantizedKVCache)",
        hint="load with kv_cache='f16' to serve several streams, or without parallel to "
        "keep the quantized cache",
    )


def _unchanged(tokens: Any, logits: Any) -> Any:
    """A logits processor that changes nothing (see ``_processors`` for why)."""
    return logits


def _processors(given: list[Any] | None, prompt_tokens: int) -> list[Any]:
    """``given`` (the session's logits processors) as the batch runs them for a prompt of
    ``prompt_tokens``. mlx-lm's generate_step shows a processor its prompt's last token
    and what it generated; its BatchGenerator shows the whole prompt too, so each is given
    the same tail here (a repeat penalty reads its last 20 tokens: the first ones would
    differ). Never an empty list: mlx-lm 0.31's GenerationBatch.filter leaves the lists
    unfiltered when none has a processor, and a request joining later then reads a
    departed request's (a repeat penalty asked for and not applied)."""
    if not given:
        return [_unchanged]
    skip = prompt_tokens - 1

    def tail(processor: Any) -> Any:
        return lambda tokens, logits: processor(tokens[skip:], logits)

    return [tail(processor) for processor in given]


def open_batch(
    model: Any,
    *,
    slots: int,
    context: int,
    eos_ids: Sequence[int],
    vocab_size: int,
    kv_bits: int | None = None,
    kv_bytes: int = 0,
    lock: threading.RLock | None = None,
) -> MlxBatch:
    """A batched runtime on ``model`` (an mlx-lm model the session loaded): ``slots``
    sequences of ``context`` tokens each, ending at ``eos_ids`` (unless ignore_eos), the
    vocabulary ``vocab_size``. ``kv_bits`` must be None (see ``refuse_quantized_cache``).
    ``kv_bytes``: one sequence's KV cache at ``context`` tokens, which sizes what prefix
    reuse may keep (0: nothing is kept). ``lock``: held around every MLX call, shared
    with the session's own (MLX is not driven from two threads at once).

    Raises:
        SettingError: a setting out of range, or a quantized KV cache.
    """
    from mlx_lm.models import cache as mlx_cache

    slots = checks.integer("slots", slots, low=1, high=MAX_PARALLEL, note="streams")
    context = checks.integer("context", context, low=2)
    kv_bytes = checks.integer("kv_bytes", kv_bytes, low=0)
    if kv_bits is not None:
        raise _quantized(f"a {kv_bits}-bit KV cache")
    # reuse only over mlx-lm's plain KVCache: a rotating window drops a prefix's start
    plain = all(type(c) is mlx_cache.KVCache for c in mlx_cache.make_prompt_cache(model))
    return MlxBatch(
        model,
        slots=slots,
        context=context,
        eos_ids=tuple(eos_ids),
        vocab_size=vocab_size,
        budget=slots * kv_bytes if plain else 0,
        lock=lock or threading.RLock(),
    )


class _Seeded:
    """A request's sampler drawing from its own random key (see the module text): MLX's
    random state is set to the request's key before each draw, and the key the draw
    leaves is read at the next one (reading it then waits only for the step that drew,
    which the next step's forward pass needs anyway)."""

    def __init__(self, sampler: Callable[[Any], Any], seed: int) -> None:
        self._sampler = sampler
        self._seed = seed
        self._after: Any = None  # the key the last draw left (an mx.array, lazy)

    def __call__(self, logprobs: Any) -> Any:
        import mlx.core as mx

        if self._after is not None:
            high, low = (int(x) for x in self._after.tolist())
            self._seed = (high << 32) | low  # mx.random.seed(s) sets the key [s >> 32, s]
        mx.random.seed(self._seed)
        token = self._sampler(logprobs)
        state: Any = mx.random.state  # the calling thread's: [key]
        self._after = state[0]
        return token


@dataclass(kw_only=True)
class _Live:
    """One request the generator holds."""

    uid: int  # mlx-lm's id for it
    cached: int  # prompt tokens taken from a kept prefix
    reported: bool = False  # its first step was given (with ``cached``)
    ended: bool = False  # mlx-lm finished it (and dropped it from the batch)


class MlxBatch:
    """Up to ``slots`` sequences on one BatchGenerator (a BatchRuntime; see the module
    text). Driven by one thread; ``close`` may come from another once it stopped."""

    def __init__(
        self,
        model: Any,
        *,
        slots: int,
        context: int,
        eos_ids: tuple[int, ...],
        vocab_size: int,
        budget: int,
        lock: threading.RLock,
    ) -> None:
        import importlib

        from mlx_lm import sample_utils
        from mlx_lm.models.cache import LRUPromptCache

        # the module (mlx_lm's package exports a function of the same name), as Any
        generate: Any = importlib.import_module("mlx_lm.generate")

        self._model: Any = model
        self._slots = slots
        self._context = context
        self._vocab = vocab_size
        self._lock = lock
        self._samplers = sample_utils
        ends = [((eos,), None) for eos in eos_ids]  # any end id ends the sequence
        self._ends = generate.SequenceStateMachine({"normal": ends} if ends else {})
        self._no_end = generate.SequenceStateMachine({})  # ignore_eos
        self._budget = budget  # bytes the running caches and the kept prefixes may hold
        self._kept: Any = LRUPromptCache(max_size=slots) if budget > 0 else None
        self._gen: Any = self._generator()
        self._live: dict[int, _Live] = {}  # rid -> request
        self._rids: dict[int, int] = {}  # mlx-lm's uid -> rid

    def _generator(self) -> Any:
        from mlx_lm.generate import BatchGenerator

        return BatchGenerator(
            self._model,
            completion_batch_size=self._slots,
            prefill_batch_size=self._slots,
            prefill_step_size=PREFILL_STEP,
        )

    @property
    def slots(self) -> int:
        return self._slots

    @property
    def context(self) -> int:
        return self._context

    # --- requests ---------------------------------------------------------------------

    def add(self, request: SeqRequest) -> None:
        """Start ``request``, from the longest kept prefix of its prompt.

        Raises:
            GenerationError: the prompt is empty or does not fit the context, every slot is
                taken, or ``request.rid`` is running already.
        """
        gen = self._open()
        check_admission(
            request,
            context=self._context,
            slots=self._slots,
            running=self._live,
            busy=len(self._live),
        )
        prompt = list(request.prompt)
        sampling = request.sampling
        with self._lock, backend_errors(TARGET, "adding a request"):
            cache, reused = self._prefix(prompt)
            sampler, processors = sampler_for(self._samplers, sampling, self._vocab)
            if sampling.temperature > 0:
                sampler = _Seeded(sampler, generation_seed(sampling))
            (uid,) = gen.insert(
                [prompt[reused:]],
                max_tokens=[self._context - len(prompt)],  # the room left: the loop's is its own
                caches=[cache],
                all_tokens=[prompt[:reused]],  # a list mlx-lm extends: a fresh one
                samplers=[sampler],
                logits_processors=[_processors(processors, len(prompt))],
                state_machines=[self._no_end if sampling.ignore_eos else self._ends],
            )
        self._live[request.rid] = _Live(uid=uid, cached=reused)
        self._rids[uid] = request.rid

    def _prefix(self, prompt: list[int]) -> tuple[Any, int]:
        """A copy of the kept cache sharing the longest prefix with ``prompt``, trimmed to
        it, and its length (None, 0: nothing worth reusing)."""
        if self._kept is None:
            return None, 0
        from mlx_lm.models.cache import trim_prompt_cache

        cache, rest = self._kept.fetch_nearest_cache(_KEY, prompt)
        if cache is None:
            return None, 0
        if not rest:  # the whole prompt is kept: its last token gives the first logits
            trim_prompt_cache(cache, 1)
            rest = prompt[-1:]
        reused = len(prompt) - len(rest)
        return (cache, reused) if reused >= MIN_REUSE else (None, 0)

    def remove(self, rid: int) -> None:
        """Drop ``rid`` (mlx-lm drops an ended one itself), keeping its cache for prefix
        reuse. An id not running is ignored."""
        live = self._live.pop(rid, None)
        if live is None:
            return
        self._rids.pop(live.uid, None)
        if live.ended or self._gen is None:
            return
        with self._lock, backend_errors(TARGET, "removing a request"):
            kept = self._gen.remove([live.uid], return_prompt_caches=self._kept is not None)
            for cache, tokens in kept.values():
                self._keep(tokens, cache)

    def forget_prefixes(self) -> None:
        """Drop every kept prefix (Session.clear_cache); running sequences are untouched."""
        self._open()
        if self._kept is not None:
            with self._lock:
                self._kept.trim_to(n_sequences=0)

    def _keep(self, tokens: Sequence[int], cache: Any) -> None:
        """Keep ``cache`` (the KV of ``tokens``) for prefix reuse, within the budget."""
        if self._kept is None or not tokens or not cache:
            return
        if any(c.size() != len(tokens) for c in cache):
            # never key a cache by tokens it does not hold (mlx-lm's extraction changed)
            log.debug("not keeping a prefix: its cache does not hold its %d tokens", len(tokens))
            return
        self._kept.insert_cache(_KEY, list(tokens), cache)
        self._fit()

    def _fit(self) -> None:
        """Hold the kept prefixes within what the running sequences leave of the budget."""
        if self._kept is not None and len(self._kept):
            self._kept.trim_to(n_bytes=self._budget - int(self._gen.prompt_cache_nbytes))

    # --- steps ----------------------------------------------------------------------------

    def step(self) -> list[SeqStep]:
        """One BatchGenerator step; what each request produced (one still prefilling
        produces nothing). A failed step ends every request in the batch (the generator's
        state is unknown then) and starts a fresh generator for the next ones.

        Raises:
            GenerationError: mlx-lm failed the step.
        """
        gen = self._open()
        with self._lock:
            try:
                with backend_errors(TARGET, "a batched step"):
                    self._fit()
                    _, responses = gen.next()
                    return [s for s in map(self._read, responses) if s is not None]
            except GenerationError:
                self._restart()
                raise

    def _read(self, response: Any) -> SeqStep | None:
        """A generator response as a SeqStep (None: a request no longer here)."""
        rid = self._rids.get(response.uid)
        live = self._live.get(rid) if rid is not None else None
        if rid is None or live is None:
            return None
        cached = 0 if live.reported else live.cached
        live.reported = True
        token = (int(response.token),)
        if response.finish_reason is None:
            return SeqStep(rid=rid, tokens=token, cached=cached)
        live.ended = True
        self._keep(response.all_tokens, response.prompt_cache)
        if response.finish_reason == "stop":  # an end id: no text
            return SeqStep(rid=rid, tokens=(), end="stop", cached=cached)
        return SeqStep(rid=rid, tokens=token, end="length", cached=cached)

    def _restart(self) -> None:
        for live in self._live.values():
            live.ended = True
        if self._kept is not None:
            self._kept.trim_to(n_sequences=0)
        old, self._gen = self._gen, None
        with contextlib.suppress(Exception):  # it only gives back Metal's wired limit
            old.close()
        self._gen = self._generator()

    # --- lifetime -------------------------------------------------------------------------

    def _open(self) -> Any:
        if self._gen is None:
            raise GenerationError("the batched runtime is closed", hint="load the model again")
        return self._gen

    def close(self) -> None:
        """Free the generator, its caches and the kept prefixes. Idempotent."""
        with self._lock:
            gen, self._gen = self._gen, None
            if gen is None:
                return
            self._live.clear()
            self._rids.clear()
            if self._kept is not None:
                self._kept.trim_to(n_sequences=0)
            self._model = None
            with backend_errors(TARGET, "closing"):
                gen.close()
                # the step mlx-lm ran ahead may still be computing: let it finish before
                # its buffers go (and before the interpreter exits, at a session's end)
                import mlx.core as mx

                mx.synchronize(gen.stream)
