"""MLX continuous batching (targets/mlx_batch.py: mlx-lm's BatchGenerator) on the embedded
default model as MLX 4BIT (group 32, as tests/test_mlx_default_model.py builds it), against
the single-stream MLX session, in one run, on MLX's default device (the CPU backend here).

Decode: 1, 2 and 4 concurrent streams through the batched runtime (different short prompts,
DECODE_TOKENS new tokens each, end-of-sequence ignored, greedy): aggregate tokens per
second from the step where every stream has its first token to the last; and one stream
through the session (``stream_tokens``, tokens after the first over the time after the
first). Each repeat runs session, batch 1/2/4, batch 4/2/1, session (the machine's load
drifts: each figure is the mean of its two runs in a repeat, each ratio is taken within a
repeat), median of REPEATS after a warm-up. The batched figures are the runtime's alone
(the batch loop's detokenizing is not in them; the session's streamer is).

Prefix reuse: a SYSTEM_TOKENS-token system prompt, then a request sharing it with another
question: the second one's time to first token against the first's, and the prompt tokens
the runtime reported reused. Each repeat starts the system prompt with its own words, so
no repeat reuses another's.

MLX's CPU backend is slow (~5 tok/s decode, ~8 tok/s prefill for this model on a 2-core
VM), so the defaults are short; the machine is shared: its load average is reported beside
the figures.

    .venv/bin/python benchmarks/mlx_batching.py [--folder MLX_FOLDER] [--repeats N]
        [--decode-tokens N] [--system-tokens N]

(with a folder: that variant is measured, instead of one made from the default model)
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from batch_timing import batch_decode, first_token_s, session_decode

REPEATS = 3
DECODE_TOKENS = 32
STREAMS = (1, 2, 4)
SYSTEM_TOKENS = 200
CONTEXT = 1024
PROMPTS = (
    "Once upon a time",
    "The capital of France is",
    "def fibonacci(n):",
    "It is a truth universally acknowledged, that a single man",
)


def open_runtime(session: Any) -> Any:
    """The batched runtime on the session's loaded model (what a batched session runs)."""
    from edgekit.targets.mlx import kv_cache_bytes
    from edgekit.targets.mlx_batch import open_batch

    folder = session._folder
    return open_batch(
        session._model,
        slots=max(STREAMS),
        context=CONTEXT,
        eos_ids=folder.eos_ids,
        vocab_size=folder.vocab_size,
        kv_bytes=kv_cache_bytes(folder, CONTEXT, None),
    )


def measure(folder: Path, repeats: int, tokens: int, system_tokens: int) -> dict[str, Any]:
    from edgekit.targets.mlx import MlxTarget

    session = MlxTarget.load(folder, context=CONTEXT)
    batch = open_runtime(session)
    prompts = [session.tokenize(p) for p in PROMPTS]
    text = importlib.resources.files("edgekit.data").joinpath("pride-and-prejudice-opening.txt")
    book = session.tokenize(text.read_text(encoding="utf-8"), add_special=False)
    decode: dict[str, list[float]] = {"session": [], **{f"batch_{n}": [] for n in STREAMS}}
    pairs: dict[str, list[float]] = {"batch_1_vs_session": [], "batch_4_vs_batch_1": []}
    ttft: dict[str, list[float]] = {"first": [], "second": []}
    cached: list[int] = []
    for run in range(repeats + 1):
        # ABBA order within a repeat, ratios paired within it: the machine's load drifts
        a = session_decode(session, prompts[0], tokens)
        figures = {f"batch_{n}": batch_decode(batch, prompts[:n], tokens) for n in STREAMS}
        again = {
            f"batch_{n}_again": batch_decode(batch, prompts[:n], tokens) for n in STREAMS[::-1]
        }
        b = session_decode(session, prompts[0], tokens)
        system = session.tokenize(f"Reading {run}.") + book[:system_tokens]
        question = session.tokenize(" Who is Mr. Bingley?", add_special=False)
        first = first_token_s(batch, 2 * run, system + question)
        other = session.tokenize(" Who is Jane?", add_special=False)
        second = first_token_s(batch, 2 * run + 1, system + other)
        if run == 0:
            continue  # warm-up
        decode["session"].append((a + b) / 2)
        for n in STREAMS:
            decode[f"batch_{n}"].append((figures[f"batch_{n}"] + again[f"batch_{n}_again"]) / 2)
        pairs["batch_1_vs_session"].append(decode["batch_1"][-1] / decode["session"][-1])
        pairs["batch_4_vs_batch_1"].append(decode["batch_4"][-1] / decode["batch_1"][-1])
        ttft["first"].append(first[0])
        ttft["second"].append(second[0])
        cached.append(second[1])
    batch.close()
    session.close()
    tok_s = {key: round(statistics.median(values), 2) for key, values in decode.items()}
    ms = {key: round(1000 * statistics.median(values), 1) for key, values in ttft.items()}
    return {
        "device": session.info.settings["device"],
        "kv_cache": session.info.kv_cache,
        "context": CONTEXT,
        "decode_tokens": tokens,
        "decode_tok_s": tok_s,
        "decode_runs": {key: [round(v, 2) for v in values] for key, values in decode.items()},
        "ratio_4_vs_1": round(statistics.median(pairs["batch_4_vs_batch_1"]), 2),
        "ratio_batch_1_vs_session": round(statistics.median(pairs["batch_1_vs_session"]), 3),
        "paired_ratios": {key: [round(v, 3) for v in values] for key, values in pairs.items()},
        "prefix": {
            "system_tokens": system_tokens,
            "ttft_ms": ms,
            "second_vs_first": round(ms["second"] / ms["first"], 3),
            "ttft_runs_ms": {k: [round(1000 * v, 1) for v in vs] for k, vs in ttft.items()},
            "cached_tokens": cached,
        },
    }


def default_variant(tmp: Path) -> Path:
    """The default model as MLX 4BIT at group 32, through edgekit's HF export of it."""
    from edgekit.converters.convert import convert_model
    from edgekit.targets.mlx import MlxTarget

    from edgekit.default_model import default_model_path

    convert_model(default_model_path(), "hf", tmp / "hf")
    folder = tmp / "smollm2-4bit"
    convert_model(tmp / "hf", MlxTarget.format.name, folder, quant="4BIT", recipe="group_size=32")
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, help="an MLX variant folder")
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--decode-tokens", type=int, default=DECODE_TOKENS)
    parser.add_argument("--system-tokens", type=int, default=SYSTEM_TOKENS)
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.folder or default_variant(Path(tmp))
        started = os.getloadavg()
        figures = measure(folder, args.repeats, args.decode_tokens, args.system_tokens)
    print(
        json.dumps(
            {
                "benchmark": "mlx_batching",
                "model": "SmolLM2-135M-Instruct (HF export of the Q4_1 GGUF) as MLX 4BIT, group 32",
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
