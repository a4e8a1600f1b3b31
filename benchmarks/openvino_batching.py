"""OpenVINO continuous batching (targets/openvino_batch.py) on the embedded default model as
OpenVINO INT4, against the single-stream OpenVINO session, in one run.

Decode: 1, 2 and 4 concurrent streams through the batched runtime (different short prompts,
DECODE_TOKENS new tokens each, end-of-sequence ignored, greedy): aggregate tokens per
second from the step where every stream has its first token to the last; and one stream
through the session (``stream_tokens``, tokens after the first over the time after the
first). Each repeat runs session, batch 1/2/4, batch 4/2/1, session (the machine's load
drifts: each figure is the mean of its two runs in a repeat, each ratio is taken within a
repeat), median of REPEATS after a warm-up. The batched figures are the runtime's alone
(the batch loop's detokenizing is not in them; the session's streamer is). Issue targets:
4 streams >= 2.5x one stream; one stream through the batch >= 0.97x the session.

Prefix reuse: a ~1,000-token system prompt, then a request sharing it with another
question: the second one's time to first token against the first's (target <= 20%). Each
repeat starts the system prompt with its own words, so no repeat restores another's.

The machine is shared: its load average is reported beside the figures.

    .venv/bin/python benchmarks/openvino_batching.py [EXPORTED_INT4_FOLDER]

(with a folder: that export is measured, instead of one made from the default model)
"""

from __future__ import annotations

import importlib.resources
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from batch_timing import batch_decode, first_token_s, session_decode

REPEATS = 5
DECODE_TOKENS = 128
STREAMS = (1, 2, 4)
SYSTEM_TOKENS = 1000
PROMPTS = (
    "Once upon a time",
    "The capital of France is",
    "def fibonacci(n):",
    "It is a truth universally acknowledged, that a single man",
)


def measure(folder: Path) -> dict[str, Any]:
    from edgekit.targets.openvino import OpenVinoTarget
    from edgekit.targets.openvino_batch import open_batch
    from edgekit.targets.openvino_runtime import read_settings

    settings = read_settings(
        "CPU",
        folder,
        inference_precision=None,
        kv_cache=None,
        threads=None,
        context=None,
        max_prompt_len=None,
        min_response_len=None,
    )
    session = OpenVinoTarget.load(folder, device="CPU")
    batch = open_batch(folder, settings, slots=max(STREAMS))
    prompts = [session.tokenize(p) for p in PROMPTS]
    text = importlib.resources.files("edgekit.data").joinpath("pride-and-prejudice-opening.txt")
    book = session.tokenize(text.read_text(encoding="utf-8"))
    decode: dict[str, list[float]] = {"session": [], **{f"batch_{n}": [] for n in STREAMS}}
    pairs: dict[str, list[float]] = {"batch_1_vs_session": [], "batch_4_vs_batch_1": []}
    ttft: dict[str, list[float]] = {"first": [], "second": []}
    cached: list[int] = []
    for run in range(REPEATS + 1):
        # ABBA order within a repeat, ratios paired within it: the machine's load drifts
        a = session_decode(session, prompts[0], DECODE_TOKENS)
        figures = {f"batch_{n}": batch_decode(batch, prompts[:n], DECODE_TOKENS) for n in STREAMS}
        figures |= {
            f"batch_{n}_again": batch_decode(batch, prompts[:n], DECODE_TOKENS)
            for n in STREAMS[::-1]
        }
        b = session_decode(session, prompts[0], DECODE_TOKENS)
        system = session.tokenize(f"Reading {run}.") + book[:SYSTEM_TOKENS]
        first = first_token_s(batch, 2 * run, system + session.tokenize(" Who is Mr. Bingley?"))
        second = first_token_s(batch, 2 * run + 1, system + session.tokenize(" Who is Jane?"))
        if run == 0:
            continue  # warm-up
        decode["session"].append((a + b) / 2)
        for n in STREAMS:
            decode[f"batch_{n}"].append((figures[f"batch_{n}"] + figures[f"batch_{n}_again"]) / 2)
        pairs["batch_1_vs_session"].append(decode["batch_1"][-1] / decode["session"][-1])
        pairs["batch_4_vs_batch_1"].append(decode["batch_4"][-1] / decode["batch_1"][-1])
        ttft["first"].append(first[0])
        ttft["second"].append(second[0])
        cached.append(second[1])
    batch.close()
    session.close()
    tok_s = {key: round(statistics.median(values), 1) for key, values in decode.items()}
    ms = {key: round(1000 * statistics.median(values), 1) for key, values in ttft.items()}
    return {
        "inference_precision": settings.precision,
        "kv_cache": settings.kv_cache,
        "threads": settings.threads,
        "context": settings.context,
        "decode_tok_s": tok_s,
        "decode_runs": {key: [round(v, 1) for v in values] for key, values in decode.items()},
        "ratio_4_vs_1": round(statistics.median(pairs["batch_4_vs_batch_1"]), 2),
        "ratio_batch_1_vs_session": round(statistics.median(pairs["batch_1_vs_session"]), 3),
        "paired_ratios": {key: [round(v, 3) for v in values] for key, values in pairs.items()},
        "prefix": {
            "system_tokens": SYSTEM_TOKENS,
            "ttft_ms": ms,
            "second_vs_first": round(ms["second"] / ms["first"], 3),
            "ttft_runs_ms": {k: [round(1000 * v, 1) for v in vs] for k, vs in ttft.items()},
            "cached_tokens": cached,
        },
    }


def main() -> None:
    from edgekit.converters.convert import convert_model

    from edgekit.default_model import default_model_path

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tmp) / "int4"
        if len(sys.argv) == 1:
            convert_model(default_model_path(), "hf", Path(tmp) / "hf")
            convert_model(Path(tmp) / "hf", "openvino", folder, quant="INT4")
        started = os.getloadavg()
        figures = measure(folder)
    print(
        json.dumps(
            {
                "benchmark": "openvino_batching",
                "model": "SmolLM2-135M-Instruct (HF export of the Q4_1 GGUF) as OpenVINO INT4",
                "device": "CPU",
                "cpu_count": os.cpu_count(),
                "load_average": {
                    "before_export": [round(x, 2) for x in load_before],
                    "before_measuring": [round(x, 2) for x in started],
                    "after": [round(x, 2) for x in os.getloadavg()],
                },
                **figures,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
