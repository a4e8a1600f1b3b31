"""The llama.cpp session's settings and its Llama object: every setting checked and
defaulted, then handed to llama-cpp-python (targets/llamacpp.py runs the session).

Settings come from the call, else from the model (the KV-cache type edgekit recorded in
the GGUF's ``edgekit.recipe``), else from defaults: threads = physical cores, context =
min(model context, 4096), batch min(512, context), mmap on, no GPU layers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
from edgekit.targets import checks
from edgekit.targets.runtime_calls import backend_errors

from edgekit.gguf_header import GGUFHeader

if TYPE_CHECKING:
    from llama_cpp import Llama

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
MAX_PARALLEL = 64
# With parallel > 1 the generations run in the batch's own context (targets/llamacpp_batch);
# the single-stream context is kept for logits() and tokens only, this small, so the KV
# memory is the N streams' (what the planner counts), not N + 1 of them.
SINGLE_CONTEXT_WHEN_BATCHED = 512


@dataclass(frozen=True, kw_only=True)
class Settings:
    context: int
    threads: int
    batch: int
    kv_cache: str
    mmap: bool
    mlock: bool
    gpu_layers: int
    seed: int | None
    logits: bool
    parallel: int = 1  # generations decoded together (continuous batching)

    @property
    def single_context(self) -> int:
        """The single-stream context's size (smaller when a batch runs the generations)."""
        if self.parallel > 1:
            return min(self.context, SINGLE_CONTEXT_WHEN_BATCHED)
        return self.context


def read_settings(given: dict[str, Any], header: GGUFHeader) -> Settings:
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
    return Settings(
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
        parallel=checks.integer(
            "parallel", given.get("parallel", 1), low=1, high=MAX_PARALLEL, note="streams"
        ),
    )


def open_llama(path: Path, settings: Settings) -> Llama:
    """llama-cpp-python's Llama for ``path`` with ``settings``.

    Raises:
        GenerationError: llama.cpp refused the file (mapped from its own exception).
    """
    import llama_cpp

    kv = settings.kv_cache
    with backend_errors("llama.cpp", f"loading {path}", hint="run with -v to see llama.cpp's log"):
        return llama_cpp.Llama(
            model_path=str(path),
            n_ctx=settings.single_context,
            n_threads=settings.threads,
            n_threads_batch=settings.threads,
            n_batch=min(settings.batch, settings.single_context),
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
