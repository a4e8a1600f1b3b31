"""Timing shared by the batching benchmarks (mlx_batching.py, openvino_batching.py): the
aggregate decode rate of streams run together through a BatchRuntime, one stream's rate
through the session, and a request's time to its first token.

Imported by those scripts as a sibling module (run them as ``python benchmarks/X.py``).
"""

from __future__ import annotations

import time
from typing import Any


def batch_decode(batch: Any, prompts: list[list[int]], tokens: int) -> float:
    """Aggregate decode tokens/s of ``prompts`` run together."""
    from edgekit.targets.batching import SeqRequest
    from edgekit.targets.values import Sampling

    greedy = Sampling(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    counts = dict.fromkeys(range(len(prompts)), 0)
    for rid, prompt in enumerate(prompts):
        batch.add(SeqRequest(rid=rid, prompt=tuple(prompt), sampling=greedy))
    start, after = 0.0, 0
    while counts:
        produced = 0
        for out in batch.step():
            counts[out.rid] += len(out.tokens)
            produced += len(out.tokens)
        if start:
            after += produced
        elif all(counts.values()):  # every stream has its first token: decoding from here
            start = time.perf_counter()
        for rid in [rid for rid, n in counts.items() if n >= tokens]:
            batch.remove(rid)
            del counts[rid]
    return after / (time.perf_counter() - start)


def session_decode(session: Any, prompt: list[int], tokens: int) -> float:
    from edgekit.targets.values import Sampling

    greedy = Sampling(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    stamps: list[tuple[float, int]] = []
    for chunk in session.stream_tokens(prompt, greedy):
        stamps.append((time.perf_counter(), chunk.tokens))
    first = next(i for i, (_, n) in enumerate(stamps) if n)
    count = sum(n for _, n in stamps[first + 1 :])
    return count / (stamps[-1][0] - stamps[first][0])


def first_token_s(batch: Any, rid: int, prompt: list[int]) -> tuple[float, int]:
    """Seconds from add to the first token, and the prompt tokens reported cached."""
    from edgekit.targets.batching import SeqRequest
    from edgekit.targets.values import Sampling

    greedy = Sampling(max_tokens=1, temperature=0.0)
    started = time.perf_counter()
    batch.add(SeqRequest(rid=rid, prompt=tuple(prompt), sampling=greedy))
    while True:
        for out in batch.step():
            if out.tokens or out.end:
                seconds = time.perf_counter() - started
                batch.remove(rid)
                return seconds, out.cached
