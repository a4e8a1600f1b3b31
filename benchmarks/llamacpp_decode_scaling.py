"""What llama.cpp itself gives from batching on this machine: the time of one
``llama_decode`` holding the next token of 1, 2 and 4 sequences, with nothing of edgekit
or Python between the calls (the low-level C API through llama-cpp-python's bindings).

Aggregate tokens a second at N sequences = N / (time of one decode of N tokens). If four
tokens cost nearly four times one token, no batching over llama.cpp can give four streams
much more than one stream's rate: this is the ceiling edgekit's batched runtime
(targets/llamacpp_batch.py) works under. Each sequence has PREFILL tokens in its own KV
cache (``kv_unified`` off, as the runtime opens it) before the timed steps.

Every GGUF file given is measured, at each thread count, flash attention off and on.
Prints one JSON document.

    .venv/bin/python benchmarks/llamacpp_decode_scaling.py MODEL.gguf [MODEL.gguf ...]
        [--threads 1,2] [--steps 60]

Without a model: the embedded default model requantized to Q4_0, Q4_K_M and Q8_0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

SEQUENCES = (1, 2, 4)
PREFILL = 100
CONTEXT = 1024  # per sequence


def decode_ms(model: Any, sequences: int, threads: int, flash: bool, steps: int) -> float:
    """Median time of one llama_decode of ``sequences`` tokens (one per sequence), in ms."""
    import llama_cpp as lib

    params = lib.llama_context_default_params()
    params.n_ctx = CONTEXT * sequences
    params.n_seq_max = sequences
    params.kv_unified = False
    params.n_batch = params.n_ubatch = 512
    params.n_threads = params.n_threads_batch = threads
    params.flash_attn_type = (
        lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
    )
    params.no_perf = True
    ctx = lib.llama_init_from_model(model, params)
    if not ctx:
        raise SystemExit("llama.cpp could not make a context")
    batch = lib.llama_batch_init(512, 0, sequences)
    try:

        def fill(tokens: list[tuple[int, int, int, bool]]) -> None:
            batch.n_tokens = len(tokens)
            for i, (token, pos, seq, logits) in enumerate(tokens):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
                batch.seq_id[i][0], batch.logits[i] = seq, logits

        for seq in range(sequences):
            fill([(100 + j % 50, j, seq, j == PREFILL - 1) for j in range(PREFILL)])
            if lib.llama_decode(ctx, batch) != 0:
                raise SystemExit("llama_decode failed on the prefill")
        times = []
        for step in range(steps):
            fill([(200 + seq, PREFILL + step, seq, True) for seq in range(sequences)])
            t0 = time.perf_counter()
            if lib.llama_decode(ctx, batch) != 0:
                raise SystemExit("llama_decode failed")
            times.append(time.perf_counter() - t0)
        return statistics.median(times[5:]) * 1000
    finally:
        lib.llama_batch_free(batch)
        lib.llama_free(ctx)


def measure(path: Path, threads: list[int], steps: int) -> list[dict[str, Any]]:
    import llama_cpp as lib

    model = lib.llama_model_load_from_file(str(path).encode(), lib.llama_model_default_params())
    if not model:
        raise SystemExit(f"llama.cpp could not load {path}")
    rows = []
    try:
        for t in threads:
            for flash in (False, True):
                ms = {n: decode_ms(model, n, t, flash, steps) for n in SEQUENCES}
                tok_s = {n: n * 1000 / ms[n] for n in SEQUENCES}
                rows.append(
                    {
                        "model": path.name,
                        "threads": t,
                        "flash_attention": flash,
                        "decode_ms": {str(n): round(v, 2) for n, v in ms.items()},
                        "tok_s": {str(n): round(v, 1) for n, v in tok_s.items()},
                        "4_vs_1": round(tok_s[4] / tok_s[1], 2),
                    }
                )
    finally:
        lib.llama_model_free(model)
    return rows


def requantized(folder: Path) -> list[Path]:
    from edgekit.converters.gguf.quantize import quantize_gguf

    from edgekit.default_model import default_model_path

    out = []
    for quant in ("Q4_0", "Q4_K_M", "Q8_0"):
        path = folder / f"smollm2-135m-{quant.lower()}.gguf"
        quantize_gguf(default_model_path(), path, quant)
        out.append(path)
    return out


def main() -> None:
    import llama_cpp as lib

    parser = argparse.ArgumentParser()
    parser.add_argument("models", nargs="*", type=Path)
    parser.add_argument("--threads", default=str(os.cpu_count() or 1))
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    lib.llama_backend_init()
    with tempfile.TemporaryDirectory() as tmp:
        models = args.models or requantized(Path(tmp))
        rows = [row for m in models for row in measure(m, threads, args.steps)]
    print(
        json.dumps(
            {
                "benchmark": "llamacpp_decode_scaling",
                "llama_cpp_python": lib.__version__,
                "system_info": lib.llama_print_system_info().decode().strip(),
                "cpus": os.cpu_count(),
                "load_average_1min": round(os.getloadavg()[0], 2),
                "prefill_tokens_per_sequence": PREFILL,
                "rows": rows,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
