"""A first estimate of the memory a loaded model takes: weights + KV cache + runtime.

    weights   the variant's files (memory-mapped; every page is touched when generating)
    KV cache  2 (K and V) x layers x KV heads x head dim x context x bytes per element
    runtime   48 MiB + vocabulary x 4 bytes x 64 (compute and output buffers)

The runtime term was fitted on this project's machine: SmolLM2-135M Q4_1 under llama.cpp
measured 170.6 / 254.6 / 349.0 MB above the process baseline at contexts 512 / 4096 /
8192, against 171.2 / 254.6 / 349.0 MB estimated. The planner refines it with
measurements (calibration); until then it is labelled an estimate wherever it is shown.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgekit.modelspec import ModelSpec

# KV-cache type -> bytes per element (block types include their scales)
KV_BYTES: dict[str, float] = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q5_1": 24 / 32,
    "q5_0": 22 / 32,
    "q4_1": 20 / 32,
    "q4_0": 18 / 32,
    "iq4_nl": 18 / 32,
}
RUNTIME_BASE = 48 << 20
OUTPUT_BUFFER_ROWS = 64


@dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    weights: int
    kv_cache: int
    runtime: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.runtime


def estimate_memory(
    spec: ModelSpec, *, weight_bytes: int, context: int, kv_cache: str = "f16"
) -> MemoryEstimate:
    per_element = KV_BYTES.get(kv_cache, 2.0)
    kv = int(2 * spec.layers * spec.kv_heads * spec.head_dim * context * per_element)
    runtime = RUNTIME_BASE + spec.vocab_size * 4 * OUTPUT_BUFFER_ROWS
    return MemoryEstimate(weights=weight_bytes, kv_cache=kv, runtime=runtime)
