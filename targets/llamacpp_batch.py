"""llama.cpp's BatchRuntime (targets/batching.py): several generations at once on one
loaded model, as llama.cpp's own server runs its slots.

``open_batch`` makes a second llama.cpp context on the model an existing ``Llama`` already
loaded (the weights are not loaded twice) with one sequence id per slot and a KV cache of
``context`` tokens for each (``n_ctx = slots * context``, ``n_seq_max = slots``; the
per-sequence cache, ``kv_unified`` off, so llama.cpp gives each sequence its own
``n_ctx_seq`` cells and attention reads only the sequence's own). Each ``step`` decodes
one token of every generating slot in one ``llama_decode``, then evaluates prompt chunks
of the slots still prefilling, at most ``batch`` tokens in all, one ``llama_decode`` a
chunk, so a long prompt does not stall the others (targets/llamacpp_batch_slots.py says
why a chunk gets a call of its own); logits are asked for only where a token is sampled.
Every request has its own sampler chain and seed (targets/llamacpp_batch_sampling.py).

Numbers (measured on x86 AVX2): llama.cpp's CPU kernels give a row the same result
multiplied alone or with other sequences' rows, except the weights it repacks for
many-row products (the Q4_K and Q8_0 tensors of a Q4_K_M file) and except a one-token
prompt chunk; so on the default Q4_1 model each stream's logits equal, bit for bit, those
of the request run alone, and on Q4_K_M they move by up to about 1.0, and a near-tie
may flip (tests/test_llamacpp_batch.py measures both).

Prefix reuse: a freed slot keeps its KV cache until it is taken again; a new request goes
to the free slot whose cache shares the longest prefix with its prompt, or copies a running
sequence's cache when that saves more (targets/llamacpp_batch_slots.py), and evaluates only
the rest. Sliding-window models (Gemma 3: ``n_swa`` > 0) run with the windowed cache
(``swa_full`` off), which keeps only the last window of positions, so they never reuse.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgekit.targets import checks
from edgekit.targets.batching import SeqRequest, SeqStep, check_admission
from edgekit.targets.llamacpp_batch_sampling import new_sampler, sampler_seed
from edgekit.targets.llamacpp_batch_slots import Part, Placement, Slot, place, plan_step
from edgekit.targets.llamacpp_runtime import KV_TYPES
from edgekit.targets.runtime_calls import MEMORY_HINT, RUNTIME_HINT, backend_errors

from edgekit.errors import GenerationError

if TYPE_CHECKING:
    import numpy as np
    from llama_cpp import (
        Llama,
        llama_batch,
        llama_context_p,
        llama_context_params,
        llama_sampler_p,
    )

TARGET = "llama.cpp"
UBATCH = 512  # llama-cpp-python's n_ubatch, as the single-stream session runs
_DECODE_ERRORS = {
    1: "no room in the KV cache for the batch",
    2: "the computation was aborted",
    -1: "the batch was invalid",
}


@dataclass(kw_only=True)
class _Handles:
    """What the runtime holds from llama.cpp (freed once, by ``_release``)."""

    ctx: llama_context_p | None
    batch: llama_batch | None
    samplers: dict[int, llama_sampler_p] = field(default_factory=dict)  # seq id -> chain


def _release(handles: _Handles) -> None:
    import llama_cpp as lib

    for chain in handles.samplers.values():
        lib.llama_sampler_free(chain)
    handles.samplers.clear()
    if handles.batch is not None:
        lib.llama_batch_free(handles.batch)
        handles.batch = None
    if handles.ctx is not None:
        lib.llama_free(handles.ctx)
        handles.ctx = None


def open_batch(
    llm: Llama,
    *,
    slots: int,
    context: int,
    threads: int,
    batch: int,
    kv_cache: str,
    seed: int | None = None,
    keep_logits: bool = False,
) -> LlamaCppBatch:
    """A batched runtime on ``llm``'s loaded model: ``slots`` sequences of ``context``
    tokens each, ``threads`` threads, at most ``batch`` tokens a step, the KV cache stored
    as ``kv_cache`` (f16, q8_0, ...; flash attention on for a quantized cache, as the
    single-stream session does), ``seed`` the default of requests that give none (None:
    a random seed each). ``keep_logits``: keep a copy of the logits each token was sampled
    from, for ``LlamaCppBatch.logits`` (checks of batched numerics; it costs a copy of a
    vocabulary's floats a token). Close it before ``llm``; closing ``llm`` closes it too.

    Raises:
        SettingError: a setting of the wrong type or out of range.
        GenerationError: llama.cpp could not make the context (memory, most often).
    """
    import llama_cpp as lib

    with backend_errors(TARGET, "reading the model"):
        n_train = int(lib.llama_model_n_ctx_train(llm.model))  # a closed llm raises here
    slots = checks.integer("slots", slots, low=1, high=int(lib.llama_max_parallel_sequences()))
    context = checks.integer("context", context, low=2, high=n_train, note="the model's context")
    threads = checks.integer("threads", threads, low=1, high=checks.max_threads())
    batch = checks.integer("batch", batch, low=slots, note="one token of every slot at least")
    kv = checks.choice("kv_cache", kv_cache, tuple(KV_TYPES))
    if seed is not None:
        seed = checks.integer("seed", seed, low=0, high=checks.MAX_SEED)
    keep_logits = checks.flag("keep_logits", keep_logits)
    params = _context_params(llm, slots=slots, context=context, threads=threads, batch=batch, kv=kv)
    with backend_errors(TARGET, "making the batch context", hint=MEMORY_HINT):
        ctx = lib.llama_init_from_model(llm.model, params)
        if ctx is None:
            raise GenerationError(
                f"llama.cpp could not make a context of {slots} x {context} tokens",
                hint=MEMORY_HINT,
            )
        handles = _Handles(ctx=ctx, batch=lib.llama_batch_init(batch, 0, 1))
        try:
            if lib.llama_n_ctx_seq(ctx) < context:
                raise GenerationError(
                    f"llama.cpp gave each sequence {lib.llama_n_ctx_seq(ctx)} tokens, not "
                    f"{context}",
                    hint="run the batch with a smaller context per slot",
                )
            return LlamaCppBatch(
                llm,
                handles,
                slots=slots,
                context=context,
                batch=batch,
                seed=seed,
                keep_logits=keep_logits,
            )
        except BaseException:
            _release(handles)
            raise


def _context_params(
    llm: Llama, *, slots: int, context: int, threads: int, batch: int, kv: str
) -> llama_context_params:
    """The single-stream session's context parameters (RoPE, YaRN, ...) with the batch's
    sizes: one sequence a slot, each with a cache of its own (``kv_unified`` off)."""
    import llama_cpp as lib

    params = lib.llama_context_params.from_buffer_copy(llm.context_params)
    params.n_ctx = slots * context
    params.n_seq_max = slots
    params.kv_unified = False
    params.n_batch = batch
    params.n_ubatch = min(batch, UBATCH)
    params.n_threads = params.n_threads_batch = threads
    params.type_k = params.type_v = KV_TYPES[kv]
    # llama.cpp stores a quantized V cache only with flash attention (as open_llama).
    quantized = kv not in ("f16", "f32", "bf16")
    params.flash_attn_type = (
        lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if quantized else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
    )
    params.swa_full = False  # sliding-window layers keep their window only
    params.embeddings = False
    params.no_perf = True
    return params


def _fill(batch: Any, parts: list[Part]) -> None:
    """Write ``parts`` into ``batch`` (its arrays are plain C arrays: llama-cpp-python
    annotates ``pos`` as an array of arrays, hence ``Any``)."""
    i = 0
    for part in parts:
        seq = part.slot.seq
        for k, token in enumerate(part.tokens):
            batch.token[i] = token
            batch.pos[i] = part.pos + k
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = 0
            i += 1
        batch.logits[i - 1] = 1 if part.sample else 0
    batch.n_tokens = i


class LlamaCppBatch:
    """``slots`` llama.cpp sequences on one context (a BatchRuntime). Driven by one thread;
    ``close`` may come from another once that thread stopped."""

    def __init__(
        self,
        llm: Llama,
        handles: _Handles,
        *,
        slots: int,
        context: int,
        batch: int,
        seed: int | None,
        keep_logits: bool,
    ) -> None:
        import llama_cpp as lib

        self._llm = llm  # keeps the model alive while the context uses it
        self._handles = handles
        # Freed on close(), when the runtime is collected, or when llm closes (its exit
        # stack runs this before it frees the model the context was made on).
        self._finalizer = weakref.finalize(self, _release, handles)
        llm._stack.callback(self._finalizer)
        self._slots = [Slot(seq) for seq in range(slots)]
        self._context = context
        self._n_batch = batch
        self._seed = seed
        self._vocab = lib.llama_model_get_vocab(llm.model)
        self._n_vocab = int(lib.llama_vocab_n_tokens(self._vocab))
        self._reuse = int(lib.llama_model_n_swa(llm.model)) == 0
        self._clock = 0
        self._keep_logits = keep_logits
        self._logits: dict[int, np.ndarray] = {}  # rid -> the logits of its last token

    @property
    def slots(self) -> int:
        return len(self._slots)

    @property
    def context(self) -> int:
        return self._context

    # --- requests ---------------------------------------------------------------------

    def add(self, request: SeqRequest) -> None:
        """Start ``request`` in a free slot, reusing the longest cached prefix.

        Raises:
            GenerationError: the prompt is empty or does not fit a slot's context, no slot
                is free, or ``request.rid`` is running already.
        """
        ctx = self._open()
        running = {s.rid for s in self._slots if s.rid is not None}
        check_admission(
            request, context=self._context, slots=self.slots, running=running, busy=len(running)
        )
        prompt = request.prompt
        placement = place(self._slots, prompt, reuse=self._reuse)
        seed = sampler_seed(request.sampling, self._seed)
        with backend_errors(TARGET, "adding a request"):
            reuse = self._keep_prefix(ctx, placement)
            chain = new_sampler(request.sampling, n_vocab=self._n_vocab, seed=seed)
        self._clock += 1
        placement.slot.start(
            request.rid,
            prompt,
            reuse=reuse,
            clock=self._clock,
            ignore_eos=request.sampling.ignore_eos,
        )
        self._handles.samplers[placement.slot.seq] = chain

    def _keep_prefix(self, ctx: llama_context_p, placement: Placement) -> int:
        """Leave the first ``placement.reuse`` tokens in the slot's cache (copied from the
        source sequence first, if any) and drop the rest; the tokens kept."""
        import llama_cpp as lib

        slot, reuse = placement.slot, placement.reuse
        memory = lib.llama_get_memory(ctx)
        if placement.source is not None:
            lib.llama_memory_seq_rm(memory, slot.seq, -1, -1)
            # A per-sequence cache is copied whole, then cut back to the shared prefix.
            lib.llama_memory_seq_cp(memory, placement.source.seq, slot.seq, -1, -1)
            slot.cached = list(placement.source.cached)
        kept = (
            reuse > 0
            and lib.llama_memory_seq_rm(memory, slot.seq, reuse, -1)
            and lib.llama_memory_seq_pos_max(memory, slot.seq) == reuse - 1
        )
        if not kept:
            lib.llama_memory_seq_rm(memory, slot.seq, -1, -1)
            slot.forget()
            return 0
        del slot.cached[reuse:]
        return reuse

    def remove(self, rid: int) -> None:
        """Free ``rid``'s slot, keeping its cache for prefix reuse. An unknown id: nothing."""
        import llama_cpp as lib

        for slot in self._slots:
            if slot.rid == rid:
                chain = self._handles.samplers.pop(slot.seq, None)
                if chain is not None:
                    lib.llama_sampler_free(chain)
                self._logits.pop(rid, None)
                slot.free()
                return

    def forget_prefixes(self) -> None:
        """Drop the caches that free slots keep for prefix reuse (Session.clear_cache)."""
        import llama_cpp as lib

        ctx = self._open()
        memory = lib.llama_get_memory(ctx)
        for slot in self._slots:
            if not slot.busy:
                lib.llama_memory_seq_rm(memory, slot.seq, -1, -1)
                slot.forget()

    # --- steps --------------------------------------------------------------------------

    def step(self) -> list[SeqStep]:
        """Decode one token of every generating sequence and prefill prompt chunks (one
        ``llama_decode`` each), sampling a token wherever logits came out. A failed step
        forgets the caches of the sequences in it and ends them (the loop removes them).

        Raises:
            GenerationError: llama.cpp failed the batch.
        """
        ctx = self._open()
        calls = plan_step(self._slots, self._n_batch)
        out: list[SeqStep] = []
        try:
            with backend_errors(TARGET, "a batched step"):
                for parts in calls:
                    self._decode(ctx, parts)
                    out += self._sample(ctx, parts)
        except GenerationError:
            self._fail(ctx, [part for parts in calls for part in parts])
            raise
        return out

    def _decode(self, ctx: llama_context_p, parts: list[Part]) -> None:
        import llama_cpp as lib

        batch = self._handles.batch
        if batch is None:  # closed under us
            raise GenerationError("the batch runtime is closed", hint="open it again")
        _fill(batch, parts)
        rc = lib.llama_decode(ctx, batch)
        if rc != 0:
            raise GenerationError(
                f"llama_decode failed ({rc}): {_DECODE_ERRORS.get(rc, 'an internal error')}",
                hint=RUNTIME_HINT,
            )
        for part in parts:
            slot = part.slot
            slot.cached.extend(part.tokens)
            if slot.pending:
                del slot.pending[: len(part.tokens)]
            else:
                slot.next_token = None

    def _sample(self, ctx: llama_context_p, parts: list[Part]) -> list[SeqStep]:
        import llama_cpp as lib

        out: list[SeqStep] = []
        index = -1
        for part in parts:
            index += len(part.tokens)  # the part's last token in the batch
            if not part.sample:
                continue
            slot = part.slot
            token = int(lib.llama_sampler_sample(self._handles.samplers[slot.seq], ctx, index))
            if self._keep_logits:
                self._keep(ctx, slot, index)
            slot.generated += 1
            cached = 0 if slot.reported else slot.reused
            slot.reported = True
            rid = slot.rid if slot.rid is not None else -1
            if lib.llama_vocab_is_eog(self._vocab, token) and not slot.ignore_eos:
                slot.ended = True
                out.append(SeqStep(rid=rid, tokens=(), end="stop", cached=cached))
            elif len(slot.cached) + 1 >= self._context:  # the sequence holds `context` now
                slot.ended = True
                out.append(SeqStep(rid=rid, tokens=(token,), end="length", cached=cached))
            else:
                slot.next_token = token
                out.append(SeqStep(rid=rid, tokens=(token,), cached=cached))
        return out

    def _fail(self, ctx: llama_context_p, parts: list[Part]) -> None:
        """After a failed step the caches of its sequences are in an unknown state: clear
        them and end those sequences."""
        import llama_cpp as lib

        memory = lib.llama_get_memory(ctx)
        for part in parts:
            lib.llama_memory_seq_rm(memory, part.slot.seq, -1, -1)
            part.slot.forget()
            part.slot.ended = True

    def _keep(self, ctx: llama_context_p, slot: Slot, index: int) -> None:
        import llama_cpp as lib
        import numpy as np

        row = lib.llama_get_logits_ith(ctx, index)
        logits = np.ctypeslib.as_array(row, shape=(self._n_vocab,)).copy()
        self._logits[slot.rid if slot.rid is not None else -1] = logits

    def logits(self, rid: int) -> np.ndarray:
        """The logits ``rid``'s last token was sampled from (kept with ``keep_logits``), to
        compare batched numerics with a single stream's.

        Raises:
            GenerationError: none kept for ``rid``.
        """
        self._open()
        logits = self._logits.get(rid)
        if logits is None:
            raise GenerationError(
                f"no logits kept for request {rid}",
                hint="open the batch with keep_logits=True and read them after a token",
            )
        return logits

    # --- lifetime -------------------------------------------------------------------------

    def _open(self) -> llama_context_p:
        ctx = self._handles.ctx
        if ctx is None:
            raise GenerationError("the batch runtime is closed", hint="open it again")
        return ctx

    def close(self) -> None:
        """Free the context, the batch and every sampler. Idempotent."""
        self._finalizer()
