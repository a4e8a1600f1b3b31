"""edgekit's MLX target against mlx-lm called directly with the same settings: the same
variant folder, the same model loader (``mlx_lm.utils.load_model``), MLX's default device,
the same prompt token ids, greedy (``make_sampler(temp=0)``), a fresh ``make_prompt_cache``
per generation, no KV quantization, ``generate_step`` with its default prefill step.

Prefill: a 512-token prompt from the shipped Austen excerpt, one new token; the time from
starting the generation to the first token. Decode: 128 new tokens greedily after a short
prompt, tokens after the first over the time after the first. Both paths stream token by
token and detokenize each token (edgekit through its public ``stream_from_tokens``
handle, Hugging Face ``tokenizers``' DecodeStream; the direct path with mlx-lm's own
streaming detokenizer, as ``mlx_lm.stream_generate`` does), as a streaming app sees them.
Each figure is the median of ROUNDS rounds after one warm-up round; within a round the two
paths run back to back, the first alternating round by round (A/B, B/A, ...), so load
drift on a shared machine hits both alike. Greedy tokens must be the same on both paths
(checked; the script fails otherwise). Prints one JSON document.

    .venv/bin/python benchmarks/mlx_overhead.py                 # converts the default model
    .venv/bin/python benchmarks/mlx_overhead.py --folder MLX_FOLDER --rounds 9

The default model (SmolLM2-135M, a GGUF) is converted to MLX 4BIT by edgekit's converter
(the route GGUF -> HF -> MLX). ``weight_bytes`` and ``bytes_per_token`` are what the
planner's CPU priors for the target are fitted from (targets/mlx.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROUNDS = 7
PREFILL_TOKENS = 512
DECODE_TOKENS = 128
DECODE_PROMPT = "Once upon a time"


class Direct:
    """mlx-lm on the variant folder, as a user of its Python API writes it."""

    def __init__(self, folder: Path) -> None:
        from mlx_lm.utils import load_model, load_tokenizer

        self.model, _ = load_model(folder)
        self.tokenizer = load_tokenizer(folder)

    def run(self, ids: list[int], new: int) -> tuple[list[float], list[int]]:
        """Stamps: the start, then one per token; and the tokens."""
        import mlx.core as mx
        from mlx_lm.generate import generate_step
        from mlx_lm.models.cache import make_prompt_cache
        from mlx_lm.sample_utils import make_sampler

        stamps = [time.perf_counter()]
        detokenizer = self.tokenizer.detokenizer
        detokenizer.reset()
        tokens: list[int] = []
        for token, _ in generate_step(
            mx.array(ids),
            self.model,
            max_tokens=new,
            sampler=make_sampler(temp=0.0),
            prompt_cache=make_prompt_cache(self.model),
        ):
            detokenizer.add_token(int(token))
            _ = detokenizer.last_segment
            stamps.append(time.perf_counter())
            tokens.append(int(token))
        detokenizer.finalize()
        return stamps, tokens


def edgekit_run(session: Any, ids: list[int], new: int) -> tuple[list[float], str]:
    """Stamps: the start, then one per token; and the text."""
    from edgekit.targets.values import Sampling

    stamps = [time.perf_counter()]
    pieces = []
    sampling = Sampling(max_tokens=new, temperature=0, ignore_eos=True)
    for chunk in session.stream_from_tokens(ids, sampling):
        now = time.perf_counter()
        stamps += [now] * chunk.tokens
        pieces.append(chunk.text)
    return stamps, "".join(pieces)


def compare(
    folder: Path, rounds: int, prefill: int = PREFILL_TOKENS, decode: int = DECODE_TOKENS
) -> dict[str, Any]:
    from importlib import resources

    from edgekit.targets.mlx import MlxTarget

    session = MlxTarget.load(folder)
    direct = Direct(folder)
    text = resources.files("edgekit.data").joinpath("pride-and-prejudice-opening.txt").read_text()
    long_ids = session.tokenize(text)[:prefill]
    short_ids = session.tokenize(DECODE_PROMPT)
    runs: dict[str, Callable[[], tuple[list[float], Any]]] = {
        "e_prefill": lambda: edgekit_run(session, long_ids, 1),
        "d_prefill": lambda: direct.run(long_ids, 1),
        "e_decode": lambda: edgekit_run(session, short_ids, decode),
        "d_decode": lambda: direct.run(short_ids, decode),
    }
    figures: dict[str, list[float]] = {k: [] for k in runs}
    first_text: list[str] = []
    for r in range(rounds + 1):
        print(f"round {r} of {rounds} (0: warm-up)", file=sys.stderr, flush=True)
        for kind in ("prefill", "decode"):
            for who in ("e", "d") if r % 2 == 0 else ("d", "e"):
                key = f"{who}_{kind}"
                stamps, out = runs[key]()
                if kind == "decode":
                    _check_same(session, key, out, first_text, r)
                if r == 0:
                    continue  # warm-up round
                if kind == "prefill":
                    figures[key].append(len(long_ids) / (stamps[1] - stamps[0]))
                else:
                    figures[key].append((len(stamps) - 2) / (stamps[-1] - stamps[1]))
    from edgekit.targets.mlx_folder import read_folder

    checked = read_folder(folder)
    result: dict[str, Any] = {
        "folder": str(folder),
        "device": session.info.settings["device"],
        "unit": session.info.unit,
        "weight_bytes": checked.weight_bytes,
        "prompt_tokens": len(long_ids),
        "decode_tokens_per_run": decode,
        "rounds": rounds,
    }
    for kind in ("prefill", "decode"):
        e, d = figures[f"e_{kind}"], figures[f"d_{kind}"]
        me, md = statistics.median(e), statistics.median(d)
        # each round's overhead (its two runs back to back), then their median
        paired = statistics.median(100 * (b - a) / b for a, b in zip(e, d, strict=True))
        result[f"{kind}_tok_s"] = {
            "edgekit": round(me, 2),
            "direct": round(md, 2),
            "overhead_pct": round(100 * (md - me) / md, 2),
            "paired_overhead_pct": round(paired, 2),
            "edgekit_runs": [round(x, 2) for x in e],
            "direct_runs": [round(x, 2) for x in d],
        }
    session.close()
    return result


def _check_same(session: Any, key: str, out: Any, first: list[str], r: int) -> None:
    """Greedy output of both paths must be the same text (the same settings ran)."""
    text = out if isinstance(out, str) else session.detokenize(out)
    if not first:
        first.append(text)
    elif text != first[0]:
        raise SystemExit(
            f"round {r}: {key} generated other text than the first decode run:\n"
            f"{text[:200]!r}\nvs\n{first[0][:200]!r}"
        )


def default_variant(out: Path, quant: str) -> Path:
    """The default model converted to MLX ``quant`` by edgekit's converter."""
    from edgekit.converters.convert import convert_model
    from edgekit.targets.mlx import MlxTarget

    from edgekit.default_model import default_model_path

    folder = out / f"smollm2-{quant.lower()}"
    convert_model(default_model_path(), MlxTarget.format.name, folder, quant=quant)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, action="append", help="an MLX variant folder")
    parser.add_argument("--quant", default="4BIT", help="for the default model (4BIT)")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    # MLX's Linux CPU backend is slow (the default model: ~5 tok/s decode, ~8 tok/s
    # prefill on a shared 2-core VM): shorter runs keep a run of the script in minutes
    parser.add_argument("--prefill-tokens", type=int, default=PREFILL_TOKENS)
    parser.add_argument("--decode-tokens", type=int, default=DECODE_TOKENS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folders = args.folder or [default_variant(Path(tmp), args.quant)]
        results = [
            compare(f, args.rounds, args.prefill_tokens, args.decode_tokens) for f in folders
        ]
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
