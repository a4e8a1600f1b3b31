"""edgekit's llama.cpp target against llama-cpp-python called directly, same settings.

Prefill: a 512-token prompt evaluated from an empty cache, then one token sampled.
Decode: 128 tokens generated greedily after a short prompt (tokens after the first,
over the time after the first). Both paths stream token by token and detokenize; each
figure is the median of REPEATS runs after one warm-up, and the two paths alternate run
by run so that drift of the machine hits both alike. Prints one JSON document.

    .venv/bin/python benchmarks/llamacpp_overhead.py
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable

REPEATS = 7
PREFILL_TOKENS = 512
DECODE_TOKENS = 128
THREADS = None  # physical cores, as both paths default to


def main() -> None:
    import llama_cpp
    import psutil
    from edgekit.targets.llamacpp import LlamaCppTarget

    from edgekit.default_model import default_model_path

    path = str(default_model_path())
    threads = THREADS or psutil.cpu_count(logical=False)
    session = LlamaCppTarget.load(path, context=2048, threads=threads)
    direct = llama_cpp.Llama(
        path, n_ctx=2048, n_threads=threads, n_threads_batch=threads, n_batch=512, verbose=False
    )
    from importlib import resources

    text = resources.files("edgekit.data").joinpath("pride-and-prejudice-opening.txt").read_text()
    prompt_ids = direct.tokenize(text.encode())[:PREFILL_TOKENS]
    prompt = direct.detokenize(prompt_ids).decode()
    short = "Once upon a time"

    def edgekit_prefill() -> float:
        session.clear_cache()
        t0 = time.perf_counter()
        session.generate(prompt, max_tokens=1, temperature=0)
        return time.perf_counter() - t0

    def direct_prefill() -> float:
        direct.reset()
        t0 = time.perf_counter()
        for _ in direct.create_completion(prompt, max_tokens=1, temperature=0, stream=True):
            pass
        return time.perf_counter() - t0

    def edgekit_decode() -> tuple[int, float]:
        session.clear_cache()
        stamps = [
            time.perf_counter()
            for c in session.stream(short, max_tokens=DECODE_TOKENS, temperature=0)
            if c.tokens
        ]
        return len(stamps) - 1, stamps[-1] - stamps[0]

    def direct_decode() -> tuple[int, float]:
        direct.reset()
        stamps = [
            time.perf_counter()
            for _ in direct.create_completion(
                short, max_tokens=DECODE_TOKENS, temperature=0, stream=True
            )
        ]
        return len(stamps) - 1, stamps[-1] - stamps[0]

    def measure(
        a: Callable[[], object], b: Callable[[], object]
    ) -> tuple[list[object], list[object]]:
        a(), b()  # warm-up
        ra, rb = [], []
        for _ in range(REPEATS):
            ra.append(a())
            rb.append(b())
        return ra, rb

    pe, pd = measure(edgekit_prefill, direct_prefill)
    de, dd = measure(edgekit_decode, direct_decode)
    n_prompt = len(session.tokenize(prompt))

    def prefill_tps(runs: list[object]) -> float:
        return n_prompt / statistics.median(runs)  # type: ignore[arg-type]

    def decode_tps(runs: list[object]) -> float:
        return statistics.median(n / t for n, t in runs)  # type: ignore[misc]

    result = {
        "prefill_tok_s": {"edgekit": prefill_tps(pe), "direct": prefill_tps(pd)},
        "decode_tok_s": {"edgekit": decode_tps(de), "direct": decode_tps(dd)},
    }
    for figure in result.values():
        figure["overhead_pct"] = 100 * (figure["direct"] - figure["edgekit"]) / figure["direct"]
    print(
        json.dumps(
            {
                "benchmark": "llamacpp_overhead",
                "model": "SmolLM2-135M-Instruct Q4_1 (embedded default)",
                "threads": threads,
                "repeats": REPEATS,
                "prompt_tokens": n_prompt,
                "decode_tokens_per_run": [n for n, _ in de],
                "results": {
                    k: {kk: round(vv, 2) for kk, vv in v.items()} for k, v in result.items()
                },
            },
            indent=2,
        )
    )
    session.close()
    direct.close()


if __name__ == "__main__":
    main()
