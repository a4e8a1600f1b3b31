"""One llama.cpp sampler chain per request of the batched runtime (targets/llamacpp_batch.py).

The chain is the one llama-cpp-python's ``Llama.generate`` builds for the single-stream
session (``Llama._init_sampler``), so a request samples alike batched or alone: the
repeat penalty over the last ``PENALTY_LAST_N`` generated tokens, then greedy at
temperature 0, else top-k, top-p, min-p, temperature and a seeded draw. (Its typical-p
stage at 1.0 and a repeat penalty of 1.0 change nothing and are left out.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgekit.targets.values import Sampling

if TYPE_CHECKING:
    from llama_cpp import llama_sampler_p

# llama-cpp-python's ``last_n_tokens_size`` default: the window the repeat penalty reads.
PENALTY_LAST_N = 64


def sampler_seed(sampling: Sampling, default: int | None) -> int:
    """The request's seed, else the runtime's, else llama.cpp's "draw a random seed"."""
    import llama_cpp

    if sampling.seed is not None:
        return sampling.seed
    return llama_cpp.LLAMA_DEFAULT_SEED if default is None else default


def new_sampler(sampling: Sampling, *, n_vocab: int, seed: int) -> llama_sampler_p:
    """A sampler chain for ``sampling``; the caller frees it (``llama_sampler_free``)."""
    import llama_cpp as lib

    params = lib.llama_sampler_chain_default_params()
    params.no_perf = True
    chain: llama_sampler_p = lib.llama_sampler_chain_init(params)
    stages = []
    if sampling.repeat_penalty != 1.0:
        stages.append(
            lib.llama_sampler_init_penalties(
                n_vocab, PENALTY_LAST_N, sampling.repeat_penalty, 0.0, 0.0
            )
        )
    if sampling.temperature == 0.0:
        stages.append(lib.llama_sampler_init_greedy())
    else:
        stages += [
            lib.llama_sampler_init_top_k(sampling.top_k),
            lib.llama_sampler_init_top_p(sampling.top_p, 1),
            lib.llama_sampler_init_min_p(sampling.min_p, 1),
            lib.llama_sampler_init_temp(sampling.temperature),
            lib.llama_sampler_init_dist(seed),
        ]
    for stage in stages:
        lib.llama_sampler_chain_add(chain, stage)  # the chain owns and frees its stages
    return chain
