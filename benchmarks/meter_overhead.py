"""The power sampler's own cost: decode tok/s of the llama.cpp target with the background
sampler running (10 Hz, the bench default) against without it, alternating run by run,
median of REPEATS. The sampler reads the meter this host has (here: the estimate, which
reads CPU utilisation) and the process's memory at each tick. Prints one JSON document.

    .venv/bin/python benchmarks/meter_overhead.py
"""

from __future__ import annotations

import json
import statistics
import time

REPEATS = 9
TOKENS = 128


def main() -> None:
    from edgekit.targets.llamacpp import LlamaCppTarget
    from edgekit.targets.values import Sampling

    from edgekit.default_model import default_model_path
    from edgekit.power.sampler import PowerSampler
    from edgekit.power.select import select_meter
    from edgekit.probe import probe_host

    profile = probe_host().profile
    meter, _ = select_meter(idle_w=profile.power.idle_w, max_w=profile.power.max_w)
    session = LlamaCppTarget.load(default_model_path(), context=1024)
    prompt = session.tokenize("Once upon a time")

    def decode() -> float:
        session.clear_cache()
        stamps = [
            time.perf_counter()
            for c in session.stream_tokens(prompt, Sampling(max_tokens=TOKENS, temperature=0))
            if c.tokens
        ]
        return (len(stamps) - 1) / (stamps[-1] - stamps[0])

    decode()  # warm-up
    without, with_sampler = [], []
    for _ in range(REPEATS):
        without.append(decode())
        with PowerSampler(meter, interval_s=0.1):
            with_sampler.append(decode())
    session.close()
    a, b = statistics.median(without), statistics.median(with_sampler)
    print(
        json.dumps(
            {
                "benchmark": "meter_overhead",
                "meter": meter.name,
                "interval_s": 0.1,
                "repeats": REPEATS,
                "decode_tok_s": {
                    "without_sampler": round(a, 2),
                    "with_sampler": round(b, 2),
                    "overhead_pct": round(100 * (a - b) / a, 2),
                    "spread_without": [round(min(without), 1), round(max(without), 1)],
                    "spread_with": [round(min(with_sampler), 1), round(max(with_sampler), 1)],
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
